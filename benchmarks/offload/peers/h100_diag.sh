#!/usr/bin/env bash
# Why carina ran out of memory at 1.1B / 8k tokens / 8 GiB cap: one carina run as the harness makes it, with
# the default allocator and with expandable segments, and planning at 70% of the cap; each prints its plan, the allocator state and the
# traceback. About 120 s. From the repository root: OUT=<dir> bash benchmarks/offload/peers/h100_diag.sh
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
SPEC='{"system":"carina","shape":"1b","tokens_per_step":8192,"seq_len":2048,"gpu_budget_gib":8.0,"steps":3,"warmup":1}'
for variant in default:0.9 expandable_segments:True:0.9 default:0.7; do
  conf=${variant%:*}; conf=${conf#default}; frac=${variant##*:}
  name=diag_${conf:+expandable}_$frac
  PEERS_CARINA_PLAN_FRACTION=$frac PYTORCH_CUDA_ALLOC_CONF=$conf timeout 100 python3 benchmarks/offload/peers/run_system.py --spec "$SPEC" \
    --out "$OUT/${name:-diag}.json" > "$OUT/${name:-diag}.log" 2>&1; echo "exit $?"
  tail -30 "$OUT/${name:-diag}.log"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
print(r['status'], r.get('tokens_per_s'), r.get('peak_gpu_bytes'), r.get('reason','')[:900]); \
print(json.dumps((r.get('settings') or {}).get('plan'))[:1500])" "$OUT/${name:-diag}.json"
done

# Sourced by the ckpt device scripts: `step NAME SECONDS CMD...` runs CMD under `timeout` (TERM, then KILL
# 2 s later), its limit clipped to what is left of BUDGET_S since $start, tees everything into $LOG, sets
# status=1 on a failure or a skip, and never aborts the script. `left` prints the seconds left.
# The caller sets BUDGET_S, LOG, start and status first.
left() { echo $((BUDGET_S - ($(date +%s) - start) - 3)); }
step() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  [ "$limit" -gt "$l" ] && limit=$l
  if [ "$limit" -lt 5 ]; then
    echo "== $name: skipped (budget of ${BUDGET_S}s spent)" | tee -a "$LOG"; status=1; return 0
  fi
  echo "== $name (limit ${limit}s, at $(($(date +%s) - start)) s)" | tee -a "$LOG"
  timeout --signal=TERM --kill-after=2 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $(($(date +%s) - start)) s" | tee -a "$LOG"
  [ $rc -eq 0 ] || status=1
  return 0
}
# lane_begin LOGNAME WORKDIR: the ckpt device scripts' common start: records and LOG under $OUT/ckpt, a
# scratch folder WORK removed at exit, the budget clock (start, status), B and COMMON (the benches' options).
lane_begin() {
  mkdir -p "$OUT/ckpt"
  LOG="$OUT/ckpt/$1"
  : >"$LOG"
  WORK=$2
  mkdir -p "$WORK"
  trap 'rm -rf "$WORK"' EXIT
  start=$(date +%s)
  status=0
  B=benchmarks/ckpt
  COMMON=(--model llama --device "$DEVICE" --dir "$WORK/run")
}
# lane_env: the ckpt device scripts' environment: has (PARTS membership), PYTHON, PYTHONPATH with src and the
# carried wheels of .whl-ckpt (isal: ISA-L's CRC-32 for the checksums), records into $OUT/ckpt; prints the
# checksum backend.
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
lane_env() {
  PYTHON=${PYTHON:-python3}
  export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CARINA_RESULTS_DIR="$OUT/ckpt"
  if ls .whl-ckpt/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-ckpt \
      .whl-ckpt/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-ckpt
  fi
  "$PYTHON" -c "from carina.ckpt.checksum import BACKEND; print('checksum backend:', BACKEND)"
}

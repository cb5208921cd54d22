# Sourced by the device lanes (io/lane_h200.sh, infra_storage/h200.sh, infra_storage/h200_frontends.sh): the budget
# clock and the step runner. Needs BUDGET_S and REC set. Optional: start (the clock's zero, default now), M (default
# 1: scales every step's minimum and maximum seconds), STEPS (names of the only steps to run; default all).
# step NAME MIN_S MAX_S CMD...: runs CMD under timeout min(MAX_S, budget left); SKIPPED when fewer than MIN_S are left.
start=${start:-$(date +%s)}
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
step() {
  local name=$1 min=$(($2 * ${M:-1})) max=$(($3 * ${M:-1})); shift 3
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then echo "== $name: not in STEPS ($STEPS)"; return; fi
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then echo "== $name: SKIPPED ($l s left, needs $min s)"; return; fi
  [ "$max" -gt "$l" ] && max=$l
  echo "== $name (timeout $max s, t=$(($(date +%s) - start)) s)"
  timeout -k 5 "$max" "$@"; local rc=$?
  echo "== $name rc=$rc after $(($(date +%s) - start)) s; files in $REC: $(find "$REC" -maxdepth 1 -type f | wc -l)"
}

# Sourced by the storage device lanes (h200.sh, h200_frontends.sh): the budget clock and the step runner.
# Needs BUDGET_S and REC set; M (default 1) scales every step's minimum and maximum seconds.
# step NAME MIN_S MAX_S CMD...: runs CMD under timeout min(MAX_S, budget left); SKIPPED when fewer than MIN_S are left.
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
step() {
  local name=$1 min=$(($2 * ${M:-1})) max=$(($3 * ${M:-1})); shift 3
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then echo "== $name: SKIPPED ($l s left, needs $min s)"; return; fi
  [ "$max" -gt "$l" ] && max=$l
  echo "== $name (timeout $max s, t=$(($(date +%s) - start)) s)"
  timeout -k 3 "$max" "$@"; local rc=$?
  echo "== $name rc=$rc after $(($(date +%s) - start)) s; files in $REC: $(find "$REC" -maxdepth 1 -type f | wc -l)"
}

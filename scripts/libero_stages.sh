# What scripts/libero10.sh and scripts/libero_row.sh share (sourced, not run): choosing the stages,
# running them, and the bench stage (the suite's two halves at the same time, one core each, as
# BENCHMARKS 17.3, then 17.4's row). Reads HEISD, PY, ALL_STAGES, TASKS (the suite's tasks in
# LIBERO's order) and BENCH (where the halves go).

pick_stages() {  # STAGE...: sets STAGES (none: ALL_STAGES), refusing an unknown one before anything is made
  STAGES=("$@")
  [ ${#STAGES[@]} -gt 0 ] || STAGES=("${ALL_STAGES[@]}")
  local s
  for s in "${STAGES[@]}"; do
    [[ " ${ALL_STAGES[*]} " == *" $s "* ]] || { echo "unknown stage '$s'; stages: ${ALL_STAGES[*]}" >&2; exit 2; }
  done
  [ -x "$HEISD" ] || { echo "no $HEISD: run 'make install' first" >&2; exit 2; }
}

run_stages() {  # LABEL: each of STAGES in turn, its start time logged
  local s
  for s in "${STAGES[@]}"; do
    echo "== $1$s ($(date -u +%H:%M:%S) UTC)"
    "stage_$s"
  done
}

calibrated() {  # DATASTORE: has calibrate written its hybrid threshold into the datastore's manifest?
  [ -f "$1/manifest.json" ] && "$PY" -c \
    "import json, sys; sys.exit('hybrid' not in json.load(open(sys.argv[1]))['extras'])" "$1/manifest.json"
}

# the row's methods beside AR: SpecVLA, retrieval, ours and the paper's HeiSD (its switch and tolerance)
ROW_METHODS=(specvla retrieval heisd heisd+no-prefill-skip+tol:paper+threshold)

bench_halves() {  # BENCHMARK FLAG...: TASKS' first and last five at once, each into BENCH/{a,b}, ROW_METHODS
  local benchmark=$1 pids=() tasks half p
  shift
  for half in a b; do
    if [ $half = a ]; then tasks=("${TASKS[@]:0:5}"); else tasks=("${TASKS[@]:5:5}"); fi
    "$HEISD" bench --benchmark "$benchmark" --tasks "${tasks[@]}" --episodes 3 --seed 0 --threads 1 "$@" \
      --only "${ROW_METHODS[@]}" --out "$BENCH/$half" > "${BENCH}_$half.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a bench half failed: see ${BENCH}_a.log and ${BENCH}_b.log" >&2; exit 1; }; done
  echo "bench reports: $BENCH/a/report.md $BENCH/b/report.md"
  [ -f "$BENCH/a/bench.json" ] && [ -f "$BENCH/b/bench.json" ] && bench_row
  return 0
}

bench_row() {  # BENCHMARKS 17.4's row from the two halves: successes over both, speedup and AL per half
  "$PY" - "$BENCH" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{h}/bench.json")) for h in "ab")
for ra, rb in zip(a, b, strict=True):
    assert ra["method"] == rb["method"], "the halves benched other methods"
    wins = round(ra["sr"] * ra["episodes"]) + round(rb["sr"] * rb["episodes"])
    n = ra["episodes"] + rb["episodes"]
    print(f"{ra['method']}: {wins}/{n} ({100 * wins / n:.1f}%), speedup {ra['speedup']:.2f}x / {rb['speedup']:.2f}x, "
          f"AL {ra['acceptance_length']:.2f} / {rb['acceptance_length']:.2f}")
PY
}

#!/usr/bin/env bash
# BENCHMARKS 17.4's row of LIBERO-Spatial, LIBERO-Object or LIBERO-Goal with the shipped target and
# drafter (checkpoints/SUITE/vla, checkpoints/SUITE/drafter) and the project's own commands: the
# recordings that target was last trained on (the datastore holds their frames: 16.2, 8.2, 17.5),
# clean held-out episodes for the calibration, the datastore and its calibration, then the bench (as
# 17.3: the suite's two halves at the same time, init states 0-2 of every task).
#
#   bash scripts/libero_row.sh SUITE [STAGE ...]    # SUITE: libero_spatial, libero_object or libero_goal
#
# Stages: demos datastore calibrate bench (default: all, in order). Every stage resumes: a recorded
# task's file is kept and a task cut off mid-way continues from its OUT.partial, a finished datastore
# or calibration is skipped, and the bench continues from its finished episodes, so a killed run is
# started again with the same command. Commands run from the repository root, so the reports name
# paths a reader can paste. On the 2-core CPU machine (BENCHMARKS 17.6, 16.4, 8.6), each suite's
# recordings about an hour, its datastore and calibration 4-5 minutes and its bench 20-23.
#
# Environment: OUT (the working folder, relative to the repository root; default outputs/SUITE),
# WORKERS (simulator processes, default 2), HEISD and PY (the heisd command and the Python that has
# heisd; default: the project's .venv).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HEISD=${HEISD:-$ROOT/.venv/bin/heisd}
PY=${PY:-$ROOT/.venv/bin/python}
WORKERS=${WORKERS:-2}
SUITES=(libero_spatial libero_object libero_goal)
ALL_STAGES=(demos datastore calibrate bench)
SUITE=${1:-}
[[ " ${SUITES[*]} " == *" $SUITE "* ]] || { echo "usage: $0 SUITE [STAGE ...]; SUITE: ${SUITES[*]}" >&2; exit 2; }
shift
# shellcheck source=scripts/libero_stages.sh
source "$ROOT/scripts/libero_stages.sh"
pick_stages "$@"
cd "$ROOT"
OUT=${OUT:-outputs/$SUITE}
mkdir -p "$OUT"
TARGET=checkpoints/$SUITE/vla
DRAFTER=checkpoints/$SUITE/drafter
DATASTORE=$OUT/datastore
BENCH=$OUT/bench  # the bench's halves: BENCH/a, BENCH/b

record() {  # FOLDER TASK EPISODES SEED NOISE: one task's expert episodes into OUT/demos/FOLDER, unless there
  local out=$OUT/demos/$1
  [ -f "$out/$2_demo.hdf5" ] || "$HEISD" demos --benchmark "$SUITE" --tasks "$2" --episodes "$3" --seed "$4" \
    --noise "$5" --image-size 128 --workers "$WORKERS" --out "$out"
}
# per suite: TASKS in LIBERO's order, the training recordings (record_demos, DEMO_FOLDERS), the held-out
# ones (HELDOUT)
case $SUITE in
  libero_spatial)
    P=pick_up_the_black_bowl_ S=_and_place_it_on_the_plate
    TASKS=("${P}between_the_plate_and_the_ramekin$S" "${P}next_to_the_ramekin$S" "${P}from_table_center$S"
           "${P}on_the_cookie_box$S" "${P}in_the_top_drawer_of_the_wooden_cabinet$S" "${P}on_the_ramekin$S"
           "${P}next_to_the_cookie_box$S" "${P}on_the_stove$S" "${P}next_to_the_plate$S" "${P}on_the_wooden_cabinet$S")
    record_demos() {  # stage 2's recordings, the shipped target's last training data (checkpoints/README)
      local t
      for t in next_to_the_ramekin next_to_the_plate next_to_the_cookie_box on_the_stove on_the_ramekin \
               in_the_top_drawer_of_the_wooden_cabinet; do record spatial_s3 "$P$t$S" 30 3 0.3; done
      record spatial_s3 "${P}between_the_plate_and_the_ramekin$S" 20 3 0.3
      for t in from_table_center on_the_cookie_box on_the_wooden_cabinet; do record spatial_s3 "$P$t$S" 10 3 0.3; done
      for t in next_to_the_ramekin next_to_the_plate next_to_the_cookie_box on_the_stove; do
        record spatial_s4 "$P$t$S" 20 4 0.3
      done
      for t in "${TASKS[@]}"; do record spatial_heldout "$t" 2 2 0; done
    }
    DEMO_FOLDERS=(spatial_s3 spatial_s4) HELDOUT=spatial_heldout ;;
  libero_object)
    TASKS=()
    for t in alphabet_soup cream_cheese salad_dressing bbq_sauce ketchup tomato_sauce butter milk chocolate_pudding \
             orange_juice; do TASKS+=("pick_up_the_${t}_and_place_it_in_the_basket"); done
    record_demos() {  # the 50 episodes a task every stage of the target trained on (checkpoints/README)
      local t
      for t in "${TASKS[@]}"; do record libero_object "$t" 50 0 0.3; done
      for t in "${TASKS[@]}"; do record libero_heldout "$t" 2 1 0; done
    }
    DEMO_FOLDERS=(libero_object) HELDOUT=libero_heldout ;;
  libero_goal)
    TASKS=(open_the_middle_drawer_of_the_cabinet put_the_bowl_on_the_stove put_the_wine_bottle_on_top_of_the_cabinet
           open_the_top_drawer_and_put_the_bowl_inside put_the_bowl_on_top_of_the_cabinet
           push_the_plate_to_the_front_of_the_stove put_the_cream_cheese_in_the_bowl turn_on_the_stove
           put_the_bowl_on_the_plate put_the_wine_bottle_on_the_rack)
    record_demos() {  # GOAL_DEMOS of checkpoints/README's stage 2: seed 0 without the rack, then seeds 1 and 3
      local t
      for t in "${TASKS[@]:0:9}"; do record goal_s0 "$t" 30 0 0.3; done
      for t in push_the_plate_to_the_front_of_the_stove open_the_top_drawer_and_put_the_bowl_inside; do
        record goal_s1 "$t" 25 1 0.1
      done
      for t in "${TASKS[@]:0:3}" "${TASKS[@]:4:1}" "${TASKS[@]:6:3}"; do record goal_s1c "$t" 10 1 0.3; done
      record goal_s3 put_the_wine_bottle_on_the_rack 40 3 0.3
      for t in "${TASKS[@]}"; do record goal_heldout "$t" 2 2 0; done
    }
    DEMO_FOLDERS=(goal_s0 goal_s1 goal_s1c goal_s3) HELDOUT=goal_heldout ;;
esac

files_of() {  # FOLDER...: sets FILES to the recorded files in OUT/demos/FOLDER..., refusing none
  local f
  shopt -s nullglob
  FILES=()
  for f in "$@"; do FILES+=("$OUT/demos/$f"/*.hdf5); done
  shopt -u nullglob
  [ ${#FILES[@]} -gt 0 ] || { echo "no demonstrations in $OUT/demos/{$(IFS=,; echo "$*")}: run the demos stage first" >&2; exit 2; }
}

stage_demos() { record_demos; }
stage_datastore() {
  [ -f "$DATASTORE/manifest.json" ] && return
  files_of "${DEMO_FOLDERS[@]}"
  "$HEISD" build-datastore --benchmark "$SUITE" --target "$TARGET" --demos "${FILES[@]}" --out "$DATASTORE" --threads 2
}
stage_calibrate() {
  calibrated "$DATASTORE" && return
  [ -f "$DATASTORE/manifest.json" ] || { echo "no datastore in $DATASTORE: run the datastore stage first" >&2; exit 2; }
  files_of "$HELDOUT"
  "$HEISD" calibrate --target "$TARGET" --datastore "$DATASTORE" --demos "${FILES[@]}" --drafter "$DRAFTER" --threads 2
}
stage_bench() {
  calibrated "$DATASTORE" || { echo "$DATASTORE is not calibrated: run the calibrate stage first" >&2; exit 2; }
  bench_halves "$SUITE" --target "$TARGET" --drafter "$DRAFTER" --datastore "$DATASTORE"
}

run_stages "$SUITE "

#!/usr/bin/env bash
# LIBERO-10's row of BENCHMARKS 17.4 from nothing, with the project's own commands: the wrist-camera
# demonstrations (BENCHMARKS 18.9), the behaviour-cloned target and one DAgger round (18.10), the
# round's fine-tune made again with keyframe weights (18.18: the shipped target; the behaviour cloning's action
# bins at +-the largest action since 18.28, which the later stages keep), the drafter,
# datastore and calibration (as 18.3), the bench (as 17.3: the suite's two halves at the same time,
# init states 0-2 of every task), then the 100-episode AR evaluation on init states 0-9 (last: the
# bench's row does not need it).
#
#   bash scripts/libero10.sh [STAGE ...]       # default: every stage, in order
#
# Stages: demos bc dagger keyframe drafter datastore calibrate bench eval. Every stage resumes: one
# whose output is complete is skipped and one that was cut off continues (a task's recording from
# its OUT.partial, training from its last checkpoint, DAgger from its kept rollouts, eval and bench
# from their finished episodes), so a killed run is started again with the same command.
# On the 2-core CPU machine (18.9, 18.10, 18.18): demos about 2.3 h, bc 1.5 h, dagger 1.4 h, keyframe
# 0.9 h, eval 0.9 h.
#
# Environment: OUT (the working folder, default outputs/libero10 in the repository; every path named
# here is inside it), WORKERS (simulator processes, default 2), HEISD and PY (the heisd command and
# the Python that has heisd; default: the project's .venv).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HEISD=${HEISD:-$ROOT/.venv/bin/heisd}
PY=${PY:-$ROOT/.venv/bin/python}
OUT=${OUT:-$ROOT/outputs/libero10}
WORKERS=${WORKERS:-2}
ALL_STAGES=(demos bc dagger keyframe drafter datastore calibrate bench eval)
# shellcheck source=scripts/libero_stages.sh
source "$ROOT/scripts/libero_stages.sh"
pick_stages "$@"
mkdir -p "$OUT"
cd "$OUT"

# the suite's tasks in LIBERO's order; the bench's halves are the first and the last five
TASKS=(
  LIVING_ROOM_SCENE2_put_both_the_alphabet_soup_and_the_tomato_sauce_in_the_basket
  LIVING_ROOM_SCENE2_put_both_the_cream_cheese_box_and_the_butter_in_the_basket
  KITCHEN_SCENE3_turn_on_the_stove_and_put_the_moka_pot_on_it
  KITCHEN_SCENE4_put_the_black_bowl_in_the_bottom_drawer_of_the_cabinet_and_close_it
  LIVING_ROOM_SCENE5_put_the_white_mug_on_the_left_plate_and_put_the_yellow_and_white_mug_on_the_right_plate
  STUDY_SCENE1_pick_up_the_book_and_place_it_in_the_back_compartment_of_the_caddy
  LIVING_ROOM_SCENE6_put_the_white_mug_on_the_plate_and_put_the_chocolate_pudding_to_the_right_of_the_plate
  LIVING_ROOM_SCENE1_put_both_the_alphabet_soup_and_the_cream_cheese_box_in_the_basket
  KITCHEN_SCENE8_put_both_moka_pots_on_the_stove
  KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it
)
ROUND=dag_l10w/round_1  # the DAgger round whose labelled rollouts the keyframe stage trains on
TARGET=l10w_kf
BENCH=bench  # the bench's halves: bench/a, bench/b

trained_to() {  # DIR STEPS: has the training run in DIR saved its checkpoint at step STEPS?
  [ -f "$1/train_info.json" ] && "$PY" -c \
    "import json, sys; sys.exit(json.load(open(sys.argv[1]))['step'] != int(sys.argv[2]))" "$1/train_info.json" "$2"
}
need() {  # DIR STEPS STAGE: refuse to build on a training that has not finished
  trained_to "$1" "$2" || { echo "$1 has not finished its $2 steps: run the $3 stage first" >&2; exit 2; }
}
record() {  # OUT TASK EPISODES SEED NOISE: one task's demonstrations, unless its file is there
  [ -f "$1/$2_demo.hdf5" ] || "$HEISD" demos --benchmark libero_10 --tasks "$2" --episodes "$3" --seed "$4" \
    --noise "$5" --image-size 128 --wrist --workers "$WORKERS" --out "$1"
}
demos_present() {  # sets DEMOS, the training demonstrations
  shopt -s nullglob
  DEMOS=(demos/l10w_s0/*.hdf5 demos/l10w_s1/*.hdf5)
  shopt -u nullglob
  [ ${#DEMOS[@]} -gt 0 ] || { echo "no demonstrations in $OUT/demos: run the demos stage first" >&2; exit 2; }
}

stage_demos() {
  for t in "${TASKS[@]}"; do record demos/l10w_s0 "$t" 30 0 0.3; done
  # the two tasks the expert fails most under noise 0.3, topped up at noise 0.1
  record demos/l10w_s1 "${TASKS[9]}" 18 1 0.1
  record demos/l10w_s1 "${TASKS[3]}" 12 1 0.1
  # clean held-out episodes on fresh layouts, for calibration (an episode's layout depends on its
  # seed, task and index alone, so task by task records what one `--tasks all` command would)
  for t in "${TASKS[@]}"; do record demos/l10w_heldout "$t" 2 2 0; done
}
stage_bc() {
  demos_present
  trained_to l10w_bc 6000 && return
  "$HEISD" train-vla --benchmark libero --wrist --demos "${DEMOS[@]}" --out l10w_bc --steps 6000 --batch-size 64 \
    --threads 2 --image-size 64 --shift-pad 1 --eval-every 500 --save-every 500 --action-bounds absmax \
    $([ -f l10w_bc/train_state.pt ] && echo --resume)
}
stage_dagger() {
  demos_present
  trained_to "$ROUND/vla" 3000 && return
  need l10w_bc 6000 bc
  "$HEISD" dagger --benchmark libero_10 --init l10w_bc --demos "${DEMOS[@]}" --tasks all --out dag_l10w \
    --episodes 6 --rounds 1 --steps 3000 --lr 3e-4 --threads 2 --workers "$WORKERS"
}
stage_keyframe() {  # the round's fine-tune again (seed 21, as dagger ran it) with the keyframes weighted up
  demos_present
  trained_to "$TARGET" 3000 && return
  need "$ROUND/vla" 3000 dagger
  local rollouts=() t
  # the registry's task order, as dagger passed them, so the same episodes are held out
  for t in "${TASKS[@]}"; do rollouts+=("$ROUND/rollouts/${t}_demo.hdf5"); done
  "$HEISD" train-vla --benchmark libero --init-from l10w_bc --demos "${DEMOS[@]}" "${rollouts[@]}" --out "$TARGET" \
    --steps 3000 --lr 3e-4 --warmup-steps 300 --seed 21 --eval-every 500 --save-every 500 --threads 2 \
    --keyframe-weight 5 --keyframe-window 8 $([ -f "$TARGET/train_state.pt" ] && echo --resume)
}
stage_drafter() {
  demos_present
  need "$TARGET" 3000 keyframe
  [ -f l10w_drafter/model.safetensors ] && return
  "$HEISD" train-drafter --target "$TARGET" --demos "${DEMOS[@]}" --out l10w_drafter --max-frames 8000 \
    --steps 2000 --batch-size 128 --threads 2
}
stage_datastore() {
  demos_present
  need "$TARGET" 3000 keyframe
  [ -f datastore_l10w/manifest.json ] && return
  "$HEISD" build-datastore --benchmark libero_10 --target "$TARGET" --demos "${DEMOS[@]}" --out datastore_l10w \
    --threads 2
}
stage_calibrate() {
  need "$TARGET" 3000 keyframe
  calibrated datastore_l10w && return
  "$HEISD" calibrate --target "$TARGET" --datastore datastore_l10w --demos demos/l10w_heldout/*.hdf5 \
    --drafter l10w_drafter --threads 2
}
stage_bench() {
  need "$TARGET" 3000 keyframe
  bench_halves libero_10 --target "$TARGET" --drafter l10w_drafter --datastore datastore_l10w
}
stage_eval() {
  need "$TARGET" 3000 keyframe
  "$HEISD" eval --benchmark libero_10 --method ar --target "$TARGET" --tasks all --episodes 10 --seed 0 \
    --threads 1 --ray --ray-workers "$WORKERS" --out eval/ar
}

run_stages ""

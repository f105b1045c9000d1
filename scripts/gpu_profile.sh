#!/usr/bin/env bash
# Measure the per-piece cost structure of OpenVLA-7B on this machine's GPU: random bf16 weights built
# on the device (nothing downloaded), vision / prefill / decode step / tree verification at 4-64 nodes /
# one drafter pass, and on CUDA each piece's GPU kernel time, then the same with the target's passes
# replayed as CUDA graphs (--cuda-graphs). Takes about two minutes on a recent GPU (hard limit 4 min
# per profile). Everything it writes goes under one folder:
#
#   bash scripts/gpu_profile.sh [OUT_DIR]          # default OUT_DIR: outputs/gpu_profile
#
# Environment: PYTHON (an interpreter with heisd installed; default .venv/bin/python, else python3),
# DEVICE (cuda), DTYPE (bfloat16), REPEATS (20 timed runs per piece), SHAPE (7b; "tiny" for a cheap
# dry run, e.g. on a CPU: DEVICE=cpu DTYPE=float32 SHAPE=tiny bash scripts/gpu_profile.sh /tmp/dry).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/gpu_profile}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
SHAPE=${SHAPE:-7b}
REPEATS=${REPEATS:-20}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
mkdir -p "$OUT"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "device=$DEVICE dtype=$DTYPE shape=$SHAPE repeats=$REPEATS python=$PYTHON"
  if [ "${DEVICE%%:*}" = cuda ] && command -v nvidia-smi >/dev/null; then nvidia-smi; fi
} > "$OUT/environment.txt"
profile() {  # NAME, extra flags
  local name=$1; shift
  timeout 240 "$PYTHON" -m heisd.cli profile --random-openvla-7b --random-shape "$SHAPE" "$@" \
    --device "$DEVICE" --dtype "$DTYPE" --random-drafter --repeats "$REPEATS" --warmup 5 \
    --out "$OUT/$name.json" | tee "$OUT/$name.md"
}
if [ "${DEVICE%%:*}" = cuda ]; then
  # each piece's GPU kernel time too: is a pass bound by the GPU or by the host launching it?
  profile "profile_openvla_${SHAPE}_${DTYPE}" --device-work
  # the same passes replayed as CUDA graphs: one launch per pass
  profile "profile_openvla_${SHAPE}_${DTYPE}_graphs" --device-work --cuda-graphs
else
  profile "profile_openvla_${SHAPE}_${DTYPE}"
fi
echo "results in $OUT"

#!/usr/bin/env bash
# Where ddpviz's per-step cost goes on a GPU (issue 31): one device call after `scripts/gpu_check.sh`.
#
# Usage: scripts/gpu_diag.sh [--system-python PY] [--wheels DIR] [--out OUT] [--cpu]; exit 1 if a step failed
#   --system-python PY  default: .venv/bin/python where it exists, else python3
#   --wheels DIR  wheels to install into a temporary folder on PYTHONPATH (scripts/gpu_wheels.sh's, plus
#                 py-spy's if you want all threads sampled: `pip download --no-deps --only-binary=:all:
#                 --python-version 3.12 --platform manylinux1_x86_64 -d DIR py-spy`)
#   --out OUT     where the files go (default: $OUT where set, else ./ddpviz-diag): at most 7 files
#   --cpu         the same steps on CPU with small models (to try this script where there is no GPU)
#
# Writes, in order, each step under its own `timeout`:
#   flight_cost.json  the flight recorder's cost per entry held (python -m ddpviz.engine.harness.flight_cost)
#   overhead.json     the doctor's overhead series alone (python -m ddpviz.workers.doctor.gpu; on CUDA: ratio,
#                     ratio_untraced and each round's ddpviz_own_step_s)
#   pyspy-hook.txt.gz, pyspy-recorder.txt.gz  py-spy's samples of every thread of a `ddpviz train` run (raw
#                     folded stacks: `frame;frame;... count`), when py-spy is installed; else a cProfile of the training
#                     thread (DDPVIZ_PROFILE_RANK) as rank0-hook.pstats / rank0-recorder.pstats
#   attach.json       an unmodified script (examples/attach/train_regression.py, one rank, NCCL) plain and under
#                     `ddpviz run`, by its own printed iteration times, 3 rounds taking turns
#                     (python -m ddpviz.workers.bench.attach_cost: the attached NCCL rows of issue 31)
#   diag.log          everything printed
set -uo pipefail
cd "$(dirname "$0")/.."
PY= WHEELS= OUT_DIR=${OUT:-ddpviz-diag} CPU= FAILED=
while [ $# -gt 0 ]; do
  case $1 in
    --system-python) PY=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_diag: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$PY" ] || { [ -x .venv/bin/python ] && PY=.venv/bin/python || PY=python3; }
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/diag.log
SITE=$(mktemp -d /tmp/ddpviz-diag-XXXXXX)
trap 'rm -rf "$SITE"' EXIT
if [ -n "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
    >>"$LOG" 2>&1 || { echo "gpu_diag: pip could not install $WHEELS" | tee -a "$LOG" >&2; exit 2; }
fi
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
step() { echo "== $1 $(date -u +%T)" >>"$LOG"; }

step flight_cost
timeout 90 "$PY" -m ddpviz.engine.harness.flight_cost "$OUT_DIR/flight_cost.json" ${CPU:+--held 4,16} >>"$LOG" 2>&1
rc=$?; echo "flight_cost rc=$rc" >>"$LOG"; [ $rc -eq 0 ] || FAILED="$FAILED flight_cost"

if [ -n "$CPU" ]; then
  MODEL=(--device cpu --world-size 1 --model mlp --width 64 --depth 3 --global-batch-size 32 --steps 40)
else
  step overhead
  timeout 330 "$PY" -m ddpviz.workers.doctor.gpu "$OUT_DIR/overhead.json" >>"$LOG" 2>&1
  rc=$?; echo "overhead rc=$rc" >>"$LOG"; [ $rc -eq 0 ] || FAILED="$FAILED overhead"
  MODEL=(--device cuda --world-size 1 --model gpt --dataset text --width 256 --depth 4 --n-head 4 --block-size 128
         --global-batch-size 16 --steps 300)
fi
PYSPY=$(PATH=$SITE/bin:$PATH command -v py-spy || true)
for timing in hook recorder; do
  step "train $timing"
  args=(-m ddpviz.workers train --mode ddp "${MODEL[@]}" --eval-every 0 --step-delay-s 0 --bucket-cap-mb 1
        --bucket-timing "$timing")
  if [ -n "$PYSPY" ]; then
    timeout 120 "$PYSPY" record --subprocesses --rate 500 --format raw --output "$OUT_DIR/pyspy-$timing.txt" \
      -- "$PY" "${args[@]}" >>"$LOG" 2>&1
    rc=$?
    gzip -f "$OUT_DIR/pyspy-$timing.txt"
  else
    prof=$(mktemp -d /tmp/ddpviz-prof-XXXXXX)
    DDPVIZ_PROFILE_RANK=$prof timeout 120 "$PY" "${args[@]}" >>"$LOG" 2>&1
    rc=$?
    cp "$prof/rank0.pstats" "$OUT_DIR/rank0-$timing.pstats" 2>>"$LOG"
    rm -rf "$prof"
  fi
  echo "train $timing rc=$rc" >>"$LOG"; [ $rc -eq 0 ] || FAILED="$FAILED train-$timing"
done
step attach
if [ -n "$CPU" ]; then
  ATTACH=(--device cpu --nproc 1 --rounds 1 --epochs 1 --hidden 64)
else
  ATTACH=(--device cuda --nproc 1 --rounds 3 --epochs 10)
fi
timeout 300 "$PY" -m ddpviz.workers.bench.attach_cost "${ATTACH[@]}" --out "$OUT_DIR/attach.json" >>"$LOG" 2>&1
rc=$?; echo "attach rc=$rc" >>"$LOG"; [ $rc -eq 0 ] || FAILED="$FAILED attach"
step done
grep -E "^(== |flight_cost rc|overhead rc|train .* rc|attach rc|run .* (succeeded|failed))|target" "$LOG"
[ -z "$FAILED" ] || { echo "gpu_diag: failed:$FAILED (see $LOG)" >&2; exit 1; }

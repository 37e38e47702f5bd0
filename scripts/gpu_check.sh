#!/usr/bin/env bash
# The GPU check in one command, on a host with its own torch: `ddpviz doctor --gpu` in <= 8 minutes.
#
# Usage: scripts/gpu_check.sh [--system-python PY] [--wheels DIR] [--out OUT] [--cpu-only]
#   --system-python PY  the host's Python, with its own (CUDA) torch. Default: .venv/bin/python if
#                       it exists, else python3
#   --wheels DIR        wheels made by scripts/gpu_wheels.sh. Each one whose distribution PY lacks is
#                       installed with `pip install --no-index --no-deps --target` into a temporary
#                       folder put on PYTHONPATH; nothing PY has is reinstalled or shadowed, no venv
#                       is made, nothing is written into PY's environment (the folder goes on exit)
#   --out OUT           the report's folder. Default: $OUT/doctor where $OUT is set, else ./ddpviz-doctor
#   --cpu-only          `ddpviz doctor` without --gpu: tries this install path where there is no GPU
#
# Then: every ddpviz requirement is checked in PY (exit 2 naming what is missing or too old), the
# NVIDIA driver and torch's CUDA are printed and a mismatch named (python -m ddpviz.workers.doctor.versions;
# exit 2 when torch sees no CUDA device), and the doctor runs under `timeout`: SIGTERM at 435 s, its
# cleanup then stops everything it started, SIGKILL 45 s later. Exit: the doctor's (0 every check
# passed or was skipped, 1 one failed), 2 when something was missing before it started, 124 too slow.
set -uo pipefail
cd "$(dirname "$0")/.."
PY= WHEELS= OUT_DIR= GPU=--gpu
while [ $# -gt 0 ]; do
  case $1 in
    --system-python) PY=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --cpu-only) GPU=; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$PY" ] || { [ -x .venv/bin/python ] && PY=.venv/bin/python || PY=python3; }
[ -n "$OUT_DIR" ] || { [ -n "${OUT:-}" ] && OUT_DIR=$OUT/doctor || OUT_DIR=ddpviz-doctor; }
command -v "$PY" >/dev/null 2>&1 || { echo "gpu_check: --system-python $PY: not found" >&2; exit 2; }
SITE=$(mktemp -d /tmp/ddpviz-site-XXXXXX)
trap 'rm -rf "$SITE"' EXIT

if [ -n "$WHEELS" ]; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_check: --wheels $WHEELS holds no .whl files" >&2; exit 2; }
  # the wheels whose distribution PY does not have (PEP 503 names; a wheel's name is its first field)
  mapfile -t install < <("$PY" - "$WHEELS" <<'PYEOF'
import importlib.metadata as md, re, sys
from pathlib import Path
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(d.metadata["Name"] or "") for d in md.distributions()}
for w in sorted(Path(sys.argv[1]).glob("*.whl")):
    name = norm(w.name.split("-")[0])
    if name == "torch":
        sys.exit(f"gpu_check: {w.name}: ddpviz never installs torch; the host's own build is the one for its driver")
    print(w) if name not in have else print(f"gpu_check: {name}: the host has it, not installed", file=sys.stderr)
PYEOF
  ) || exit 2
  if [ ${#install[@]} -gt 0 ]; then
    echo "gpu_check: installing ${#install[@]} wheels into $SITE (--no-index --no-deps --target)" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${install[@]}" \
      || { echo "gpu_check: pip could not install the wheels from $WHEELS into $SITE" >&2; exit 2; }
  fi
fi
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

"$PY" - <<'PYEOF' || exit 2
import importlib.metadata as md, sys, tomllib
try:
    from packaging.requirements import Requirement
except ImportError:
    try:
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:  # no packaging, no pip: names only
        import re
        class Requirement:
            def __init__(self, text):
                self.name = re.split(r"[\s\[<>=!~;]", text, maxsplit=1)[0]
                self.specifier = type("Any", (), {"contains": lambda self, v, prereleases=True: True})()
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] + ["pytest>=8", "pytest-timeout>=2.3"]
bad = []
for r in map(Requirement, deps):
    try:
        v = md.version(r.name)
    except md.PackageNotFoundError:
        bad.append(f"{r.name} (missing)")
        continue
    if not r.specifier.contains(v, prereleases=True):
        bad.append(f"{r.name} {v} (needs {r.specifier})")
if bad:
    sys.exit("gpu_check: not usable here: " + ", ".join(bad) + ". Make wheels where an index is reachable: "
             "scripts/gpu_wheels.sh DIR --have <this host's pip list>, then --wheels DIR")
print(f"gpu_check: every ddpviz requirement is met in {sys.executable}", file=sys.stderr)
PYEOF

"$PY" -m ddpviz.workers.doctor.versions
cuda=$?
if [ -n "$GPU" ] && [ $cuda -ne 0 ]; then
  echo "gpu_check: torch sees no CUDA device (above: why); nothing run. --cpu-only runs the CPU checks" >&2
  exit 2
fi
timeout -k 45 435 "$PY" -m ddpviz.workers doctor $GPU --out "$OUT_DIR"
code=$?
if [ -n "${OUT:-}" ] && [ -d "$OUT_DIR/exports" ]; then  # the device machine returns at most 8 files
  tar czf "$OUT_DIR/exports.tar.gz" -C "$OUT_DIR" exports && rm -rf "$OUT_DIR/exports"
fi
[ $code -eq 124 ] && echo "gpu_check: ddpviz doctor ran past 435 s and was stopped; its report says how far it got" >&2
exit $code

#!/usr/bin/env bash
# Wheels for a GPU host that has its own torch and no package index (a cluster image, a lent box).
# Run it where an index is reachable; copy DIR to the host; there scripts/gpu_check.sh installs them.
#
# Usage: scripts/gpu_wheels.sh DIR [--have FILE] [--python-version 3.12]
#   DIR     where the wheels go (created; wheels already in it are replaced)
#   --have  the GPU host's `pip list` or `pip freeze` (its packages are not downloaded, and the
#           versions it lists are the ones the rest must fit: they are constraints of the resolution)
#   --python-version  the host's CPython (default 3.12); manylinux x86_64 wheels only
#
# Downloads every dependency of ddpviz (pyproject.toml's, and pytest + pytest-timeout, which the
# doctor's gpu_tests check runs), resolved for that Python and platform, that FILE does not name.
# Never torch (the host's own build is the one that matches its driver). At most 60 MiB in all
# ($GPU_WHEELS_LIMIT_MIB to change it): over that it stops, lists the wheels by size, and leaves
# DIR as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR= HAVE= PYVER=3.12
while [ $# -gt 0 ]; do
  case $1 in
    --have) HAVE=$2; shift 2 ;;
    --python-version) PYVER=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "gpu_wheels: unknown option $1" >&2; exit 2 ;;
    *) [ -z "$DIR" ] || { echo "gpu_wheels: one DIR only (got $DIR and $1)" >&2; exit 2; }; DIR=$1; shift ;;
  esac
done
[ -n "$DIR" ] || { echo "gpu_wheels: DIR is required (usage: scripts/gpu_wheels.sh DIR [--have FILE])" >&2; exit 2; }
[ -z "$HAVE" ] || [ -f "$HAVE" ] || { echo "gpu_wheels: --have $HAVE: no such file" >&2; exit 2; }
PY=${PYTHON:-python3}
exec "$PY" - "$DIR" "$HAVE" "$PYVER" <<'PYEOF'
import json, os, re, shutil, subprocess, sys, tempfile, tomllib
from pathlib import Path

out_dir, have_file, pyver = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
LIMIT_BYTES = int(os.environ.get("GPU_WHEELS_LIMIT_MIB", "60")) << 20
NEVER = {"torch"}  # the host's own build; ddpviz never brings one
DOCTOR_EXTRAS = ["pytest>=8", "pytest-timeout>=2.3"]  # the doctor's gpu_tests check runs pytest -m gpu
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def norm(name):  # PEP 503
    return re.sub(r"[-_.]+", "-", name).lower()


def have_list(path):
    """{name: version or None} from `pip list` (name version) or `pip freeze` (name==version)."""
    have = {}
    for line in Path(path).read_text().splitlines() if path else []:
        line = line.strip()
        if not line or line.startswith(("#", "-", "Package ")):
            continue
        if "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name, version = line.split(" @ ", 1)[0], None
        else:
            parts = line.split()
            name, version = parts[0], (parts[1] if len(parts) > 1 else None)
        have[norm(name.split("[")[0])] = version.strip() if version else None
    return have


def req_name(req):
    return norm(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0])


have = have_list(have_file)
deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"] + DOCTOR_EXTRAS
wanted = [r for r in deps if req_name(r) not in NEVER and req_name(r) not in have]
platform_args = ["--only-binary=:all:", "--python-version", pyver, "--implementation", "cp"]
for p in PLATFORMS:
    platform_args += ["--platform", p]
print(f"gpu_wheels: CPython {pyver} manylinux x86_64; the host has {len(have)} packages"
      f"{' (' + have_file + ')' if have_file else ''}; ddpviz needs {len(wanted)} it lacks: "
      f"{' '.join(req_name(r) for r in wanted) or 'none'}", flush=True)
with tempfile.TemporaryDirectory(prefix="ddpviz-wheels-") as tmp:
    tmp = Path(tmp)
    # the host's versions are fixed: the new wheels must fit them (and never bring torch)
    pins = [f"{n}=={v}" for n, v in have.items() if v and n not in NEVER and re.fullmatch(r"[0-9][0-9A-Za-z.]*", v)]
    (tmp / "constraints.txt").write_text("\n".join(pins) + "\n")
    report = tmp / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--target", str(tmp / "t"),
           "--report", str(report), "-c", str(tmp / "constraints.txt"), *platform_args, *wanted]
    if wanted and subprocess.run(cmd).returncode != 0:
        sys.exit(f"gpu_wheels: pip could not resolve {' '.join(wanted)} for CPython {pyver} next to the host's "
                 f"versions ({have_file or 'none given'}); see pip's message above")
    resolved = json.loads(report.read_text())["install"] if wanted else []
    need = [(norm(i["metadata"]["name"]), i["metadata"]["version"]) for i in resolved]
    brought = sorted(n for n, _ in need if n in NEVER)
    if brought:
        sys.exit(f"gpu_wheels: the resolution pulled in {brought}, which ddpviz never brings: name it in --have")
    need = [(n, v) for n, v in need if n not in have]
    get = tmp / "wheels"
    for n, v in need:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *platform_args, "-d", str(get),
                        f"{n}=={v}"], check=True)
    wheels = sorted(get.glob("*.whl"), key=lambda p: -p.stat().st_size) if get.exists() else []
    total = sum(p.stat().st_size for p in wheels)
    table = "\n".join(f"  {p.stat().st_size / 2**20:7.2f} MiB  {p.name}" for p in wheels)
    if total > LIMIT_BYTES:
        sys.exit(f"gpu_wheels: {total / 2**20:.1f} MiB of wheels, over the {LIMIT_BYTES >> 20} MiB limit; "
                 f"{out_dir} left as it was. Largest first:\n{table}\nName what the host already has in --have.")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    for p in wheels:
        shutil.copy2(p, out_dir / p.name)
    (out_dir / "MANIFEST.txt").write_text(
        f"# scripts/gpu_wheels.sh: CPython {pyver} manylinux x86_64, host packages from {have_file or '(none)'}\n"
        + "".join(f"{n}=={v}\n" for n, v in need))
    print(f"{table}\ngpu_wheels: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {out_dir} "
          f"(limit {LIMIT_BYTES >> 20} MiB)")
PYEOF

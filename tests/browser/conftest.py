"""Fixtures of the browser tests: the server on a free port over a tiny checkpoint (embedded mode), and a
headless system Chromium driven by selenium (never a downloaded browser or driver).

The tests skip, with the reason, only when ``/usr/bin/chromium`` or ``/usr/bin/chromedriver`` is missing
(``.ci/run`` installs Debian's ``chromium`` and ``chromium-driver`` first). ``KVLINK_RAG_BROWSER_MODEL``
(a checkpoint folder, or ``default`` for the converted default model) replaces the tiny checkpoint, e.g.
to take the README's screenshot with real answers (``KVLINK_RAG_SCREENSHOT=docs/playground.png``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from service_support import LiveServer, save_tiny_checkpoint

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,800")
KEYED_MAX_CHARS = 200
MAX_NEW_TOKENS = 16  # several token events even when the browser reads a few at once


def _missing_browser() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return (f"{' and '.join(missing)} missing: install Debian's chromium and chromium-driver "
                "(.ci/run does) to run the browser tests")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def pytest_collection_modifyitems(config, items):
    """Skip the ``browser`` tests with the reason when the system browser or its driver is missing."""
    reason = _missing_browser()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _model(tmp_path_factory) -> str:
    """The model the server loads: ``KVLINK_RAG_BROWSER_MODEL`` when set, else a tiny random checkpoint."""
    chosen = os.environ.get("KVLINK_RAG_BROWSER_MODEL", "")
    if chosen == "default":
        from kvlink_rag.model.convert import ensure_default_model
        from service.settings import get_settings

        return str(ensure_default_model(get_settings().models_dir))
    return chosen or str(save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny"))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return _model(tmp_path_factory)


def _server(home: Path, model: str, **overrides) -> LiveServer:
    from api.main import create_app
    from service.settings import Settings

    base = dict(home=home, model=model, device="cpu", max_new_tokens=MAX_NEW_TOKENS, broker_url="", index_url="",
                api_keys={}, playground=True, store_max_bytes=64 << 20, host_cache_bytes=32 << 20)
    settings = Settings(**{**base, **overrides})
    return LiveServer(create_app(settings))


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    """A running server (single tenant, no API keys, embedded index and precompute); ``.url`` is its base."""
    with _server(tmp_path_factory.mktemp("home"), model_path) as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory, model_path):
    """A running server that requires an API key (``k1`` is tenant ``t1``) and takes documents of at most
    :data:`KEYED_MAX_CHARS` characters."""
    with _server(tmp_path_factory.mktemp("home-keyed"), model_path, api_keys={"k1": "t1"},
                 max_document_chars=KEYED_MAX_CHARS) as srv:
        yield srv


@pytest.fixture
def driver(tmp_path, monkeypatch):
    """A headless system Chromium at 1280x800 with a fresh profile; nothing is downloaded (SE_OFFLINE)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium manager must not fetch a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    options.add_argument(f"--user-data-dir={profile}")
    drv = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)

"""Helpers of the service tests: settings of a test runtime."""

from __future__ import annotations

from pathlib import Path

from service.settings import Settings


def service_settings(home: Path, **overrides) -> Settings:
    """Settings of a test runtime: its own home, a small store."""
    return Settings(home=home, model="unused", device="cpu", **{"store_max_bytes": 64 << 20,
                                                               "host_cache_bytes": 32 << 20, **overrides})

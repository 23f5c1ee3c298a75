"""docker-compose.yml is valid compose for the distributed set-up (parsed, not run: no Docker here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvlink_rag.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_commands_volumes_and_health_checks():
    c = _compose()
    services = c["services"]
    assert set(services) == {"redis", "model", "api", "worker"}
    assert services["redis"]["image"].startswith("redis:") and "--appendonly" in services["redis"]["command"]
    assert services["model"]["command"] == ["kvlink-rag", "model", "fetch"]
    assert services["api"]["command"][:2] == ["kvlink-rag", "serve"] and "0.0.0.0" in services["api"]["command"]
    assert services["worker"]["command"][:2] == ["kvlink-rag", "worker"]
    assert services["api"]["ports"] == ["8000:8000"]

    for name in ("api", "worker", "model"):
        mounts = services[name]["volumes"]
        assert "kvlink-store:/data/store" in mounts and "kvlink-models:/data/models" in mounts
    named = {m.split(":")[0] for s in services.values() for m in s.get("volumes", [])}
    assert named <= set(c["volumes"]) and {"kvlink-store", "kvlink-models", "redis-data"} <= named

    for name in ("redis", "api", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    for name in ("api", "worker"):
        deps = services[name]["depends_on"]
        assert deps["redis"]["condition"] == "service_healthy"
        assert deps["model"]["condition"] == "service_completed_successfully"
    assert services["api"]["build"] == "." and (ROOT / "Dockerfile").exists()


def test_api_and_worker_share_the_readme_settings():
    services = _compose()["services"]
    env = services["api"]["environment"]
    assert env == services["worker"]["environment"]  # same model, store, index and broker
    assert env["KVLINK_RAG_INDEX_URL"].startswith("redis://redis:6379/")
    assert env["KVLINK_RAG_BROKER_URL"].startswith("redis://redis:6379/")
    assert env["KVLINK_RAG_HOME"] == "/data"
    fields = {f"KVLINK_RAG_{name.upper()}" for name in Settings.model_fields}
    readme = (ROOT / "README.md").read_text()
    for key in env:
        assert key in fields, f"{key} is not a setting"
        assert key in readme, f"{key} is not described in the README"

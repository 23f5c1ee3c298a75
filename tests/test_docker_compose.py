"""docker-compose.yml is valid compose for the distributed set-up (parsed, not run: no Docker here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_commands_volumes_and_health_checks():
    c = _compose()
    services = c["services"]
    cluster = {"redis-node-1", "redis-node-2", "redis-node-3", "redis-cluster-init"}
    assert set(services) == {"redis", "redis-cache", "model", "api", "router", "worker"} | cluster
    for name in ("redis", "redis-cache", "redis-node-1"):
        assert services[name]["image"].startswith("redis:") and "--appendonly" in services[name]["command"]
    assert "allkeys-lru" in services["redis-cache"]["command"] and "--maxmemory" in services["redis-cache"]["command"]
    assert "maxmemory-policy" not in " ".join(services["redis"]["command"])  # the index never evicts
    assert all(services[name]["profiles"] == ["cluster"] for name in cluster)
    assert "--cluster-enabled" in services["redis-node-2"]["command"]
    assert "--cluster create" in " ".join(services["redis-cluster-init"]["command"])
    assert services["model"]["command"] == ["kvlink-rag", "model", "fetch"]
    assert services["api"]["command"][:2] == ["kvlink-rag", "serve"] and "0.0.0.0" in services["api"]["command"]
    assert services["worker"]["command"][:2] == ["kvlink-rag", "worker"]
    assert services["router"]["command"][:2] == ["kvlink-rag", "router"] and services["router"]["ports"] == ["8080:8080"]
    router_env = services["router"]["environment"]
    assert router_env["KVLINK_RAG_ROUTER_EVENTS_URL"] == services["api"]["environment"]["KVLINK_RAG_EVENTS_URL"]
    assert router_env["KVLINK_RAG_INDEX_URL"] == services["api"]["environment"]["KVLINK_RAG_INDEX_URL"]
    assert services["api"]["deploy"]["replicas"] == 2 and services["api"]["ports"] == ["8000-8003:8000"]

    for name in ("api", "worker", "model"):  # no shared store: only the model volume
        assert services[name]["volumes"] == ["kvlink-models:/data/models"]
    named = {m.split(":")[0] for s in services.values() for m in s.get("volumes", [])}
    assert named <= set(c["volumes"]) and {"kvlink-models", "redis-data", "redis-cache-data"} <= named

    for name in ("redis", "redis-cache", "api", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    for name in ("api", "worker"):
        deps = services[name]["depends_on"]
        assert deps["redis"]["condition"] == deps["redis-cache"]["condition"] == "service_healthy"
        assert deps["model"]["condition"] == "service_completed_successfully"
    assert services["api"]["build"] == "." and (ROOT / "Dockerfile").exists()


def test_api_and_worker_share_the_readme_settings():
    services = _compose()["services"]
    env = services["api"]["environment"]
    assert env == services["worker"]["environment"]  # same model, index, broker and shared cache tier
    assert env["KVLINK_RAG_INDEX_URL"].startswith("redis://redis:6379/")
    assert env["KVLINK_RAG_BROKER_URL"].startswith("redis://redis:6379/")
    assert env["KVLINK_RAG_SHARED_STORE_URL"] == "${KVLINK_RAG_SHARED_STORE_URL:-redis://redis-cache:6379/0}"
    assert env["KVLINK_RAG_HOME"] == "/data"
    fields = {f"KVLINK_RAG_{name.upper()}" for name in Settings.model_fields}
    readme = (ROOT / "README.md").read_text()
    for key in env:
        assert key in fields, f"{key} is not a setting"
        assert key in readme, f"{key} is not described in the README"

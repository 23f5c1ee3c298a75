"""Helpers of the router tests (in-process and as processes)."""

from __future__ import annotations

from service_support import wait_for


def fleet_of(client, n: int) -> list[dict]:
    """The router's live replicas once ``n`` are live and synced."""
    def ready():
        reps = client.get("/router/status").json()["replicas"]
        return reps if len(reps) == n and all(r["synced"] for r in reps) else None

    return wait_for(ready, 20, what=f"{n} synced replicas")

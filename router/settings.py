"""The router's settings (env vars ``KVLINK_RAG_ROUTER_*``); the replicas' own (``KVLINK_RAG_*``: index URL, API
keys, retrieval cut-offs) are read too, for resolving a request's documents as a replica would."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Policy = Literal["document-aware", "round-robin", "least-load", "prefix-only"]
POLICIES: tuple[str, ...] = ("document-aware", "round-robin", "least-load", "prefix-only")


class RouterSettings(BaseSettings):
    """Where the replicas are and how one is chosen."""

    model_config = SettingsConfigDict(env_prefix="KVLINK_RAG_ROUTER_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address the router binds.")
    port: int = Field(8080, ge=1, le=65535, description="Port the router listens on.")
    replicas: list[str] = Field(default_factory=list, description="Replica base URLs (JSON list); empty: the "
                                "replicas registered in the events Redis.")
    events_url: str = Field("", description="Redis of the replicas' registrations and cache events (their "
                            "KVLINK_RAG_EVENTS_URL); '' = none (only round-robin and least-load by in-flight count).")
    policy: Policy = Field("document-aware", description="How a replica is chosen (README, 'Past one replica').")
    poll_s: float = Field(0.2, gt=0, le=10, description="Seconds between reads of registrations and events.")
    dead_after_s: float = Field(3.0, gt=0, le=600, description="A replica whose heartbeat is this old is dropped.")
    down_s: float = Field(5.0, ge=0, le=600, description="A replica that refused a connection is skipped this long.")
    shared_tier: bool = Field(True, description="Replicas share a cache tier (KVLINK_RAG_SHARED_STORE_URL): a "
                              "document no replica holds is fetched, not encoded, when it is precomputed.")
    overload_inflight: int = Field(32, ge=1, description="A replica with this many requests in flight from the "
                                   "router (or waiting in its scheduler) is overloaded: conversations move.")
    request_tokens: int = Field(256, ge=0, description="Load of one running or waiting request, in prompt tokens.")
    uncached_weight: float = Field(16.0, ge=0, description="Weight of a request's uncached document tokens against "
                                   "the load term in the document-aware cost (router.scoring).")
    balance_slack: float = Field(0.5, ge=0, description="Bounded load: a replica with (1 + this) x the mean "
                                 "requests (+1) goes after the others whatever its cost.")
    load_floor: bool = Field(True, description="Bounded load's other side: a replica with fewer than the mean "
                             "requests / (1 + balance_slack) goes first (document-aware), so a replica that holds "
                             "little (restarted, resyncing) is not left idle.")
    timeout_s: float = Field(600.0, gt=0, description="Seconds a forwarded request may take.")

"""Build and serve the router from its settings (``kvlink-rag router``)."""

from __future__ import annotations

import logging

from service.settings import Settings
from router.documents import DocumentResolver
from router.fleet import Fleet
from router.proxy import Router, create_router_app
from router.settings import RouterSettings

log = logging.getLogger(__name__)


def build_router(rs: RouterSettings, service: Settings) -> Router:
    """The router over the fleet of ``rs`` (listed replicas and/or registrations in ``rs.events_url``),
    resolving documents through the replicas' Redis index (``service.index_url``; an embedded index: no
    document-aware scores, the replicas still answer).

    Raises:
        ValueError: neither replicas nor an events URL, or a URL that is not Redis.
    """
    from store.redis_conn import connect, is_redis_url, split_url

    if not rs.replicas and not rs.events_url:
        raise ValueError("the router needs replicas: list them (--replica URL) or give the Redis they register "
                         "in (--events-url, KVLINK_RAG_ROUTER_EVENTS_URL)")
    client = connect(split_url(rs.events_url)[0]) if rs.events_url else None
    fleet = Fleet(client, rs.replicas, rs.dead_after_s, rs.down_s, rs.poll_s)
    resolver = None
    if is_redis_url(service.index_url):
        from service.retrieval import Retrieval
        from store.backends import open_index
        from store.redis_texts import RedisTextStore

        index = open_index(service.index_url)
        retrieval = Retrieval(index, RedisTextStore.from_url(service.index_url), service.bm25_refresh_s)
        resolver = DocumentResolver(index, retrieval, service)
    else:
        log.warning("no Redis index (KVLINK_RAG_INDEX_URL): the router cannot see documents; policy %s falls "
                    "back to load", rs.policy)
    return Router(rs, fleet, resolver, service.api_keys)


def serve(rs: RouterSettings, service: Settings) -> None:
    """Run the router with uvicorn on ``rs.host:rs.port`` (blocks)."""
    import uvicorn

    app = create_router_app(build_router(rs, service))
    uvicorn.run(app, host=rs.host, port=rs.port, log_level="info")

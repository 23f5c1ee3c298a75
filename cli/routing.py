"""``kvlink-rag router``: the routing proxy in front of N replicas (:mod:`router`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli.common import fail, make_settings

app = typer.Typer()


@app.command()
def router(replica: Annotated[Optional[list[str]], typer.Option(
               "--replica", help="A replica's base URL (repeat); default: the replicas registered in --events-url.")] = None,
           events_url: Annotated[Optional[str], typer.Option(
               help="Redis the replicas register and publish cache events in (their KVLINK_RAG_EVENTS_URL).")] = None,
           policy: Annotated[Optional[str], typer.Option(
               help="document-aware (default), round-robin, least-load or prefix-only.")] = None,
           host: Annotated[Optional[str], typer.Option(help="Bind address (KVLINK_RAG_ROUTER_HOST).")] = None,
           port: Annotated[Optional[int], typer.Option(help="Port (KVLINK_RAG_ROUTER_PORT, default 8080).")] = None
           ) -> None:
    """Route queries to the replica that already holds their documents (README, "Past one replica").

    Settings: KVLINK_RAG_ROUTER_* (router), and the replicas' KVLINK_RAG_INDEX_URL and KVLINK_RAG_API_KEYS (to
    resolve a request's documents and tenant as a replica would).
    """
    import logging

    from pydantic import ValidationError

    from router.main import serve
    from router.settings import POLICIES, RouterSettings

    if policy is not None and policy not in POLICIES:
        fail(f"--policy {policy!r}: choose {', '.join(POLICIES)}")
    given = {"replicas": replica or None, "events_url": events_url, "policy": policy, "host": host, "port": port}
    try:
        rs = RouterSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        fail(f"router settings: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(rs, make_settings())
    except ValueError as e:
        fail(str(e))

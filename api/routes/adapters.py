"""``GET /v1/adapters``: the query-side adapters a query may name in its ``adapter`` field."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import QueriesDep, TenantDep
from api.errors import error_responses

router = APIRouter(tags=["adapters"], responses=error_responses(401, 503))


@router.get("/v1/adapters")
def list_adapters(queries: QueriesDep, tenant: TenantDep) -> dict:
    """``{"adapters": [names], "default": {"k", "trained", "lora"}}``; named artifacts live in
    ``$KVLINK_RAG_HOME/links/<name>.safetensors`` (``kvlink-rag train-links --name NAME`` writes one) or come
    with the package for its model (``lookup`` for the default model)."""
    lt = queries.engine.link_tokens
    return {"adapters": queries.variants.names(),
            "default": {"k": lt.k if lt is not None else 0,
                        "trained": bool(lt is not None and lt.metadata.get("trained")),
                        "lora": queries.engine.adapter is not None}}

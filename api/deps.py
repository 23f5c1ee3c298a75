"""Typed FastAPI dependencies: the running state, the caller's tenant (API key), the services.

They are ``async`` (they never block), so resolving them takes no worker thread.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.state import ServiceState
from service.queries import QueryService

DEFAULT_TENANT = "default"
_bearer = HTTPBearer(auto_error=False, description="API key (KVLINK_RAG_API_KEYS maps keys to tenants).")


async def get_state(request: Request) -> ServiceState:
    """The app's :class:`ServiceState`.

    Raises:
        ApiError: 503 while the app is starting or stopping.
    """
    state = request.app.state.service
    if state is None or state.queries is None:
        raise ApiError(503, "not_ready", "the service is starting (loading the model); retry shortly")
    return state


StateDep = Annotated[ServiceState, Depends(get_state)]


def tenant_for_key(api_keys: dict[str, str], key: str) -> str | None:
    """The tenant of ``key`` (compared in constant time against every configured key), or None."""
    found = None
    for candidate, tenant in api_keys.items():
        if hmac.compare_digest(candidate.encode(), key.encode()):
            found = tenant
    return found


async def get_tenant(state: StateDep,
               creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """The caller's tenant: from ``Authorization: Bearer <key>``, or ``default`` when no keys are configured.

    Raises:
        ApiError: 401 for a missing or unknown key.
    """
    keys = state.settings.api_keys
    if not keys:
        return DEFAULT_TENANT
    if creds is None or not creds.credentials:
        raise ApiError(401, "missing_api_key", "missing API key: send the header 'Authorization: Bearer <key>'")
    tenant = tenant_for_key(keys, creds.credentials)
    if tenant is None:
        raise ApiError(401, "invalid_api_key", "unknown API key")
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]


async def get_queries(state: StateDep) -> QueryService:
    return state.queries


QueriesDep = Annotated[QueryService, Depends(get_queries)]

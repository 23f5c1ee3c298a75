"""The web playground: ``GET /`` (the page) and ``GET /playground/{name}`` (its scripts and style sheet).

Plain files of the ``api`` package (``api/playground/``, package data): no build step, nothing fetched
from outside the machine. Registered only when ``KVLINK_RAG_PLAYGROUND`` is true; left out of the
OpenAPI schema. One route template serves every file, so request metrics keep one label for them.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.errors import ApiError

PLAYGROUND_DIR = Path(__file__).resolve().parent.parent / "playground"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8"}

router = APIRouter(include_in_schema=False)


def playground_file(name: str) -> FileResponse:
    """The playground file ``name`` (a plain file name in :data:`PLAYGROUND_DIR`, nothing else).

    Raises:
        ApiError: 404 for any other name (no path outside the folder is reachable).
    """
    path = PLAYGROUND_DIR / name
    if "/" in name or "\\" in name or path.suffix not in MEDIA_TYPES or not path.is_file():
        raise ApiError(404, "not_found", f"no playground file {name[:80]!r}")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})


@router.get("/")
async def page() -> FileResponse:
    """The playground page."""
    return playground_file("index.html")


@router.get("/playground/{name}")
async def asset(name: str) -> FileResponse:
    """A script or style sheet of the page."""
    return playground_file(name)

"""Service commands of the ``kvlink-rag`` CLI: serve, worker, ingest, query.

``ingest`` and ``query`` talk to a running server with ``--url`` (API key from ``--api-key`` or
``KVLINK_RAG_API_KEY``), or else work on the store under ``KVLINK_RAG_HOME`` directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .cli import console, fail, make_settings, out
from .nq import DataFormatError, iter_jsonl
from .terminal import progress_bar, results_only_stdout

if TYPE_CHECKING:
    from service.runtime import Runtime

UrlOpt = Annotated[Optional[str], typer.Option("--url", help="A running server, e.g. http://127.0.0.1:8000 "
                                               "(default: work on the store directly).")]
KeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="KVLINK_RAG_API_KEY",
                                               help="API key for --url.")]
TenantOpt = Annotated[str, typer.Option(help="Tenant (direct mode; with --url the API key decides).")]


def read_documents(paths: list[Path]) -> list[dict]:
    """Documents from text files (one each: id = file name, title = stem) and JSONL(.gz) files (one
    object per line with ``text`` and optional ``id``, ``title``, ``metadata``). Exits on bad input."""
    docs: list[dict] = []
    for p in paths:
        if not p.exists():
            fail(f"{p} does not exist")
        if p.is_dir():
            fail(f"{p} is a folder; pass the files")
        name = p.name.lower()
        if name.endswith((".jsonl", ".jsonl.gz")):
            try:
                for n, obj in iter_jsonl(p):
                    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
                        fail(f"{p}:{n}: each line needs a non-empty string 'text'")
                    docs.append({"id": str(obj["id"]) if obj.get("id") is not None else f"{p.stem}-{n}",
                                 "text": obj["text"], "title": str(obj.get("title") or ""),
                                 "metadata": obj.get("metadata") or {}})
            except DataFormatError as e:
                fail(str(e))
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            fail(f"{p} is not UTF-8 text")
        if not text.strip():
            fail(f"{p} is empty")
        docs.append({"id": p.name, "text": text, "title": p.stem, "metadata": {}})
    if not docs:
        fail("no documents found in the given files")
    return docs


def _client(url: str, api_key: str | None):
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(600.0, connect=5.0))


def _check(resp) -> dict:
    """The JSON body, or exit with the server's error message."""
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status_code >= 400:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        fail(f"server answered {resp.status_code}: {err.get('message') or resp.text[:300]}")
    return body


LISTED_IDS = 20  # ingest lists this many ids (all with --json)


def print_ingested(results: list[dict], as_json: bool) -> None:
    """The ids ``ingest`` assigned, one a line (a text file's id is its file name; a JSONL line's is its
    ``id`` or ``<file stem>-<line>``) with any near-duplicates; then a summary line."""
    if as_json:
        print(json.dumps({"documents": results}, indent=2))
        return
    for r in results[:LISTED_IDS]:
        dups = ", ".join(d["id"] for d in r["near_duplicates"])
        out.print(r["id"] + (f"  (near-duplicate of {dups})" if dups else ""), markup=False, highlight=False)
    if len(results) > LISTED_IDS:
        out.print(f"... and {len(results) - LISTED_IDS} more (--json lists every id)")
    changed = sum(r["queued"] for r in results)
    dups = sum(bool(r["near_duplicates"]) for r in results)
    out.print(f"{len(results)} document{'s' if len(results) != 1 else ''}: {changed} new or changed, "
              f"{len(results) - changed} unchanged, {dups} with near-duplicates; query them with --doc-id ID")


def register(app: typer.Typer) -> None:
    """Add the service commands to ``app`` (and the ``store`` / ``index`` maintenance commands)."""
    from .store_cli import register as register_maintenance

    register_maintenance(app)

    @app.command()
    def serve(host: Annotated[Optional[str], typer.Option(help="Bind address (KVLINK_RAG_HOST).")] = None,
              port: Annotated[Optional[int], typer.Option(help="Port (KVLINK_RAG_PORT).")] = None,
              log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info") -> None:
        """Run the HTTP API (uvicorn). Without KVLINK_RAG_BROKER_URL precompute runs in this process.
        Logs, access log included, go to stderr."""
        import copy
        import logging

        if log_level.lower() not in ("critical", "error", "warning", "info", "debug", "trace"):
            fail(f"--log-level {log_level!r}: choose critical, error, warning, info, debug or trace")
        settings = make_settings(host=host, port=port)
        import uvicorn
        from uvicorn.config import LOGGING_CONFIG

        from api.main import create_app

        log_config = copy.deepcopy(LOGGING_CONFIG)
        log_config["handlers"]["access"]["stream"] = "ext://sys.stderr"  # uvicorn's default is stdout
        level = "DEBUG" if log_level.lower() == "trace" else log_level.upper()
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level.lower(),
                    log_config=log_config)

    @app.command()
    def worker(pool: Annotated[str, typer.Option(help="Celery pool: solo (one task at a time) or threads.")] = "solo",
               loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO") -> None:
        """Run one Celery precompute worker (needs KVLINK_RAG_BROKER_URL); the model loads on the first task."""
        from workers.celery_app import make_worker_app

        settings = make_settings()
        try:
            celery = make_worker_app(settings)
        except ValueError as e:
            fail(str(e))
        celery.worker_main(["worker", "-P", pool, "-l", loglevel, "-Q", settings.task_queue, "-c", "1",
                            "--without-gossip", "--without-mingle"])

    @app.command()
    def ingest(paths: Annotated[list[Path], typer.Argument(help="Text files (one document each) or JSONL(.gz).")],
               url: UrlOpt = None, api_key: KeyOpt = None, tenant: TenantOpt = "default",
               batch_size: Annotated[int, typer.Option(help="Documents per request (--url).")] = 64,
               precompute: Annotated[bool, typer.Option(help="Direct mode: precompute now (else at first query "
                                                        "or by the workers).")] = True,
               as_json: Annotated[bool, typer.Option("--json", help="Print every assigned id as JSON.")] = False) -> None:
        """Add or update documents; prints the id of each (a text file's id is its file name, a JSONL
        line's its "id" field or <file stem>-<line number>) and a summary."""
        docs = read_documents(paths)
        if batch_size < 1:
            fail("--batch-size must be >= 1")
        results = _ingest_remote(docs, url, api_key, batch_size) if url else _ingest_direct(docs, tenant, precompute)
        print_ingested(results, as_json)

    @app.command()
    def query(question: Annotated[str, typer.Argument(help="The question.")],
              top_k: Annotated[Optional[int], typer.Option("--top-k", help="Retrieve this many documents (BM25).")] = None,
              doc_id: Annotated[list[str], typer.Option("--doc-id", help="Use this document; repeat for several.")] = [],
              url: UrlOpt = None, api_key: KeyOpt = None, tenant: TenantOpt = "default",
              max_new_tokens: Annotated[Optional[int], typer.Option()] = None,
              adapter: Annotated[Optional[str], typer.Option(help="default, none, or a named adapter in "
                                                             "$KVLINK_RAG_HOME/links (train-links --name).")] = None,
              as_json: Annotated[bool, typer.Option("--json", help="Print the response JSON.")] = False) -> None:
        """Answer a question over the tenant's documents (cached KV, re-linked)."""
        if top_k is not None and doc_id:
            fail("give either --top-k or --doc-id, not both")
        body = {"question": question, "top_k": top_k, "document_ids": doc_id or None, "max_new_tokens": max_new_tokens,
                "adapter": adapter}
        body = {k: v for k, v in body.items() if v is not None}
        res = _query_remote(body, url, api_key) if url else _query_direct(body, tenant)
        if as_json:
            print(json.dumps(res, indent=2))
            return
        out.print(f"[bold]A:[/bold] {res['answer']}")
        for d in res["documents"]:
            out.print(f"  {d['id']}  {d['title'][:50]!r}  {'cache hit' if d['cache_hit'] else 'encoded now'}")
        t = res["timings"]
        out.print("  " + ", ".join(f"{k[:-2]} {v * 1000:.0f} ms" for k, v in t.items()))


def _ingest_remote(docs: list[dict], url: str, api_key: str | None, batch_size: int) -> list[dict]:
    import httpx

    results: list[dict] = []
    try:
        with _client(url, api_key) as client, progress_bar(f"ingesting into {url}", len(docs)) as bar:
            for i in range(0, len(docs), batch_size):
                batch = docs[i:i + batch_size]
                results += _check(client.post("/v1/documents", json={"documents": batch}))["documents"]
                bar.advance(len(batch))
    except httpx.HTTPError as e:
        fail(f"cannot reach {url}: {e}")
    return results


def _open_direct(settings) -> Runtime:
    """The store under ``settings.home`` (``build_runtime``: Celery queue with a broker, else none; no
    engine yet, no recovery); exits when it cannot be opened."""
    from service.runtime import StoreOpenError, build_runtime

    try:
        return build_runtime(settings, queue="auto" if settings.distributed else "none", recover=False,
                             load_engine=False)
    except StoreOpenError as e:
        fail(str(e))


def _ingest_direct(docs: list[dict], tenant: str, precompute: bool) -> list[dict]:
    from .cli import make_engine

    settings = make_settings()
    runtime = _open_direct(settings)
    store = runtime.store
    results, todo = [], []
    try:
        with progress_bar(f"ingesting into {settings.store_dir}", len(docs)) as bar:
            for d in docs:
                res = store.catalog.ingest(tenant, d["id"], d["text"], d["title"], d["metadata"])
                results.append({"id": d["id"], "queued": res.queued,
                                "near_duplicates": [{"id": i, "distance": n} for i, n in res.near_duplicates]})
                if res.queued:
                    todo.append(res.record)
                bar.advance()
        if todo and precompute and not settings.distributed:
            engine = make_engine(settings, runtime=runtime)  # one LMDB environment per process
            with progress_bar("precomputing", len(todo)) as bar, results_only_stdout():
                for rec in todo:
                    try:
                        store.catalog.precompute(tenant, rec.doc_id, rec.version, engine)
                    except ValueError as e:
                        store.catalog.fail(tenant, rec.doc_id, rec.version, str(e))
                        console.print(f"[yellow]{rec.doc_id}: {e}[/yellow]")
                    bar.advance()
    except Exception as e:  # noqa: BLE001 - invalid ids, Redis or broker down
        fail(f"ingest failed: {e}")
    finally:
        runtime.close()
    return results


def _query_remote(body: dict, url: str, api_key: str | None) -> dict:
    import httpx

    try:
        with _client(url, api_key) as client:
            return _check(client.post("/v1/query", json=body))
    except httpx.HTTPError as e:
        fail(f"cannot reach {url}: {e}")


def _query_direct(body: dict, tenant: str) -> dict:
    from api.routes.query import query_out
    from service.errors import ServiceError

    from .cli import make_engine

    settings = make_settings()
    runtime = _open_direct(settings)
    make_engine(settings, runtime=runtime)  # one LMDB environment per process
    service = runtime.queries
    try:
        with results_only_stdout():
            plan = service.plan(tenant, body["question"], body.get("document_ids"), body.get("top_k"),
                                adapter=body.get("adapter"), max_new_tokens=body.get("max_new_tokens"))
            return query_out(service.answer(plan))
    except ServiceError as e:
        fail(e.message)
    except Exception as e:  # noqa: BLE001 - e.g. Redis index down
        fail(f"query failed: {e}")
    finally:
        runtime.close()


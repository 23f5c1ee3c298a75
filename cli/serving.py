"""Service commands of the ``kvlink-rag`` CLI: serve, worker, ingest, query.

``ingest`` and ``query`` talk to a running server with ``--url`` (API key from ``--api-key`` or
``KVLINK_RAG_API_KEY``), or else work on the store under ``KVLINK_RAG_HOME`` directly. In direct mode a
query's arguments and documents are checked on the store before the model loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import (check_adapter_name, console, fail, fetch_default_model, make_engine, make_settings,
                        open_runtime, out, progress_bar, quiet_libraries, results_only_stdout)
from cli.documents import read_documents
from cli.explain import RecomputeOpt, RetentionOpt, checked_recompute, checked_retention
from kvlink_rag.settings import DEFAULT_MODEL
from store.lmdb_env import StoreBusyError

app = typer.Typer()

UrlOpt = Annotated[Optional[str], typer.Option("--url", help="A running server, e.g. http://127.0.0.1:8000 "
                                               "(default: work on the store directly).")]
KeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="KVLINK_RAG_API_KEY",
                                               help="API key for --url.")]
TenantOpt = Annotated[str, typer.Option(help="Tenant (direct mode; with --url the API key decides).")]


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
    """The ids ``ingest`` assigned, one a line on stdout (a text file's id is its file name; a JSONL line's
    is its ``id`` or ``<file stem>-<line>``) with any near-duplicates; then a summary line on stderr."""
    if as_json:
        print(json.dumps({"documents": results}, indent=2))
        return
    for r in results[:LISTED_IDS]:
        dups = ", ".join(d["id"] for d in r["near_duplicates"])
        out.print(r["id"] + (f"  (near-duplicate of {dups})" if dups else ""), markup=False, highlight=False)
    if len(results) > LISTED_IDS:
        console.print(f"... and {len(results) - LISTED_IDS} more (--json lists every id)")
    changed = sum(r["queued"] for r in results)
    dups = sum(bool(r["near_duplicates"]) for r in results)
    console.print(f"{len(results)} document{'s' if len(results) != 1 else ''}: {changed} new or changed, "
                  f"{len(results) - changed} unchanged, {dups} with near-duplicates; query them with --doc-id ID")


@app.command()
def serve(host: Annotated[Optional[str], typer.Option(help="Bind address (KVLINK_RAG_HOST).")] = None,
          port: Annotated[Optional[int], typer.Option(help="Port (KVLINK_RAG_PORT).")] = None,
          log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info") -> None:
    """Run the HTTP API (uvicorn); logs go to stderr.

    The access log goes to stderr too. Without KVLINK_RAG_BROKER_URL precompute runs in this process. The
    port is checked before the model loads.
    """
    import copy
    import logging

    if log_level.lower() not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(f"--log-level {log_level!r}: choose critical, error, warning, info, debug or trace")
    settings = make_settings(host=host, port=port)
    check_port_free(settings.host, settings.port)
    quiet_libraries()  # before transformers is imported: no "Loading weights" bar
    if settings.model == DEFAULT_MODEL:
        fetch_default_model(settings)  # with this CLI's progress bar, before uvicorn starts
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from api.main import create_app

    log_config = copy.deepcopy(LOGGING_CONFIG)
    log_config["handlers"]["access"]["stream"] = "ext://sys.stderr"  # uvicorn's default is stdout
    level = "DEBUG" if log_level.lower() == "trace" else log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level.lower(),
                log_config=log_config)


def check_port_free(host: str, port: int) -> None:
    """Exit with one line when ``host:port`` cannot be bound (in use, or not an address of this machine).

    Binds as uvicorn does (``SO_REUSEADDR``: a port left in TIME_WAIT is free) and closes at once.
    """
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as e:
        import errno

        if e.errno == errno.EADDRINUSE:
            fail(f"port {port} on {host} is in use; choose --port")
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")


@app.command()
def worker(pool: Annotated[str, typer.Option(help="Celery pool: solo (one task at a time) or threads.")] = "solo",
           loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO") -> None:
    """Run a Celery precompute worker (needs KVLINK_RAG_BROKER_URL).

    The model loads on the first task.
    """
    from workers.celery_app import make_worker_app

    settings = make_settings()
    try:
        celery = make_worker_app(settings)
    except ValueError as e:
        fail(str(e))
    quiet_libraries()
    celery.worker_main(["worker", "-P", pool, "-l", loglevel, "-Q", settings.task_queue, "-c", "1",
                        "--without-gossip", "--without-mingle"])


@app.command()
def ingest(paths: Annotated[list[Path], typer.Argument(help="Text files (one document each) or JSONL(.gz).")],
           url: UrlOpt = None, api_key: KeyOpt = None, tenant: TenantOpt = "default",
           batch_size: Annotated[int, typer.Option(help="Documents per request (--url).")] = 64,
           precompute: Annotated[bool, typer.Option(help="Direct mode: precompute now (else at first query "
                                                    "or by the workers).")] = True,
           as_json: Annotated[bool, typer.Option("--json", help="Print every assigned id as JSON.")] = False) -> None:
    """Add or update documents and print the id each one got.

    A text file's id is its file name, a JSONL line's its "id" field or <file stem>-<line number>. The ids
    go to stdout, a summary line to stderr.
    """
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
          adapter: Annotated[Optional[str], typer.Option(help="default, none, lookup (bundled: exact "
                                                         "lookups such as key-value retrieval) or a named adapter in "
                                                         "$KVLINK_RAG_HOME/links (train-links --name).")] = None,
          retention: RetentionOpt = None, recompute_ratio: RecomputeOpt = None,
          explain: Annotated[bool, typer.Option("--explain", help="Also show each document's share of the answer's "
                                                "attention and its top passages (character offsets).")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="Print the response JSON.")] = False) -> None:
    """Answer a question over the tenant's stored documents.

    The documents' cached KV is re-linked; without --url the arguments and documents are checked on the
    store before the model loads.
    """
    if top_k is not None and doc_id:
        fail("give either --top-k or --doc-id, not both")
    body = {"question": question, "top_k": top_k, "document_ids": doc_id or None, "max_new_tokens": max_new_tokens,
            "adapter": adapter, "retention": checked_retention(retention), "explain": explain or None,
            "recompute_ratio": checked_recompute(recompute_ratio)}
    body = {k: v for k, v in body.items() if v is not None}
    res = _query_remote(body, url, api_key) if url else _query_direct(body, tenant)
    if as_json:
        print(json.dumps(res, indent=2))
        return
    out.print(f"[bold]A:[/bold] {res['answer']}")
    for d in res["documents"]:
        share = f"  attribution {d['attribution']:.1%}" if d.get("attribution") is not None else ""
        out.print(f"  {d['id']}  {d['title'][:50]!r}  {'cache hit' if d['cache_hit'] else 'encoded now'}{share}")
        for p in d.get("passages") or []:
            out.print(f"      passage [{p['start']}:{p['end']}] ({p['share']:.0%})")
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


def _ingest_direct(docs: list[dict], tenant: str, precompute: bool) -> list[dict]:
    settings = make_settings()
    runtime = open_runtime(settings)
    documents = runtime.documents
    results, todo = [], []
    try:
        with progress_bar(f"ingesting into {settings.store_dir}", len(docs)) as bar:
            for d in docs:
                res = documents.ingest(tenant, d["id"], d["text"], d["title"], d["metadata"])
                results.append({"id": d["id"], "queued": res.queued,
                                "near_duplicates": [{"id": i, "distance": n} for i, n in res.near_duplicates]})
                if res.queued:
                    todo.append(res.record)
                bar.advance()
        if todo and precompute and not settings.distributed:
            make_engine(settings, runtime=runtime)  # the documents' engine; one LMDB environment per process
            with progress_bar("precomputing", len(todo)) as bar, results_only_stdout():
                for rec in todo:
                    try:
                        done = documents.precompute_or_fail(tenant, rec.doc_id, rec.version)
                    except StoreBusyError as e:  # transient: the document stays queued, the rest go on
                        console.print(f"[yellow]{rec.doc_id}: left queued, {e}[/yellow]")
                        continue
                    if done.status == "failed":
                        console.print(f"[yellow]{rec.doc_id}: {done.error}[/yellow]")
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
    """Answer on the store under ``KVLINK_RAG_HOME``: the request's fields and its documents (named ids, or
    the tenant's BM25 matches) are checked first, and only then does the model load."""
    settings = make_settings()
    check_adapter_name(settings, body.get("adapter"))  # before the store opens and the model loads
    from api.routes.query import query_out
    from service.errors import ServiceError

    runtime = open_runtime(settings)
    try:
        _check_query(runtime, body, tenant)
        make_engine(settings, runtime=runtime)  # one LMDB environment per process
        service = runtime.queries
        with results_only_stdout():
            plan = service.plan(tenant, body["question"], body.get("document_ids"), body.get("top_k"),
                                adapter=body.get("adapter"), retention=body.get("retention"),
                                recompute_ratio=body.get("recompute_ratio"),
                                explain=body.get("explain", False), max_new_tokens=body.get("max_new_tokens"))
            return query_out(service.answer(plan))
    except ServiceError as e:
        fail(e.message)
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. Redis index down
        fail(f"query failed: {e}")
    finally:
        runtime.close()


def _check_query(runtime, body: dict, tenant: str) -> None:
    """Raise :class:`service.errors.ServiceError` when the query's fields are out of range or its documents
    do not exist (unknown ids, a tenant without matching documents); reads the store only."""
    from service.documents_choice import DocumentChoice
    from service.queries import check_request, choose_documents

    question = check_request(runtime.settings, body["question"], body.get("document_ids"), body.get("top_k"),
                             body.get("max_new_tokens"))
    choice = DocumentChoice(runtime.store, runtime.retrieval, runtime.settings)
    choose_documents(choice, tenant, question, body.get("document_ids"), body.get("top_k"))

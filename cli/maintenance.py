"""Maintenance commands of the ``kvlink-rag`` CLI: ``store check [--repair]`` and ``index rebuild``.

Both work on the store under ``KVLINK_RAG_HOME`` (and the index of ``KVLINK_RAG_INDEX_URL``); the logic
is in :mod:`store.check` and :mod:`store.recovery`. Results go to stdout (one tab-separated line per
finding, or JSON with ``--json``), messages to stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from cli.common import fail, make_engine, make_settings, open_runtime

store_app = typer.Typer(no_args_is_help=True, help="Document store maintenance.")
index_app = typer.Typer(no_args_is_help=True, help="Document index maintenance.")
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]


@contextmanager
def _store_for(what: str) -> Iterator[tuple]:
    """``(settings, store)`` of ``$KVLINK_RAG_HOME`` (no engine loaded), closed afterwards; a failure inside
    (Redis or the broker down) exits with ``"{what} failed: ..."``."""
    settings = make_settings()
    store = open_runtime(settings).store
    try:
        yield settings, store
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - Redis down, broker down
        fail(f"{what} failed: {e}")
    finally:
        store.blobs.close()


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _lines(report) -> list[str]:
    rows = [f"unreferenced_cache\t{k}\t{n}" for k, n in report.unreferenced_caches]
    rows += [f"missing_cache\t{t}\t{d}\t{k}" for t, d, k in report.missing_caches]
    for pairs, kind in ((report.texts_without_records, "text_without_record"),
                        (report.records_without_texts, "record_without_text"),
                        (report.corrupt_texts, "corrupt_text"), (report.corrupt_records, "corrupt_record"),
                        (report.unencodable, "unencodable_text")):
        rows += [f"{kind}\t{t}\t{d}" for t, d in pairs]
    return rows


@store_app.command("check")
def store_check(repair: Annotated[bool, typer.Option("--repair", help="Delete unreferenced caches, re-queue ready "
                                                     "documents whose cache is gone, recreate records from "
                                                     "texts, mark documents whose text is lost or corrupt "
                                                     "failed, sanitise titles and metadata that are not valid "
                                                     "Unicode.")] = False,
                as_json: JsonOpt = False,
                min_age_s: Annotated[float, typer.Option("--min-age-s", min=0, help="Leave caches younger than "
                                                         "this alone (a precompute may be about to use them).")
                                     ] = 60.0) -> None:
    """Check that caches, records and texts match; exit 1 on problems.

    Finds caches no record points at, ready records whose cache is gone, texts without records, records
    without texts, corrupt texts or records, and text that is not valid Unicode (lone surrogates). Exit 0 when clean (or repaired), 1 when problems were found.
    """
    from store.check import check_store

    with _store_for("store check") as (settings, store):
        report = check_store(store, min_age_s=min_age_s)
        if repair and report.problems:
            # recreated records find their stored caches through the engine (else they would be re-encoded)
            engine = make_engine(settings) if report.texts_without_records or report.corrupt_records else None
            check_store(store, repair=True, engine=engine, min_age_s=min_age_s)
            report.repaired = True
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        for line in _lines(report):
            typer.echo(line)
    if report.untracked_caches:
        _say(f"{len(report.untracked_caches)} ad-hoc cache(s) of ask/demo "
             f"({sum(n for _, n in report.untracked_caches)} bytes): no record by design, evicted like any other")
    if not report.problems:
        _say("store is consistent: every document's cache has a record, every record its text and cache")
        return
    _say(f"{report.problems} problem(s): {len(report.unreferenced_caches)} unreferenced cache(s) "
         f"({report.unreferenced_bytes} bytes), {len(report.missing_caches)} ready record(s) without cache, "
         f"{len(report.texts_without_records)} text(s) without record, {len(report.records_without_texts)} "
         f"record(s) without text, {len(report.corrupt_texts)} corrupt text(s), {len(report.corrupt_records)} "
         f"corrupt record(s), {len(report.unencodable)} document(s) with text that is not valid Unicode")
    if report.repaired:
        _say("repaired")
        return
    _say("run `kvlink-rag store check --repair` to fix them")
    raise typer.Exit(1)


@index_app.command("rebuild")
def index_rebuild(as_json: JsonOpt = False) -> None:
    """Recreate missing or corrupt index records from the stored texts.

    Title, metadata and version come from the text; a record is ready when the tenant's cache is stored,
    else queued (precomputed by the workers, by the server when it starts, or at the document's first
    query). Use it after Redis restarted empty.
    """
    from service.documents import DocumentService

    with _store_for("index rebuild") as (settings, store):
        report = DocumentService(store, make_engine(settings)).rebuild_index()
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        rows_by_status = (("ready", report.ready), ("queued", report.queued), ("corrupt_text", report.corrupt_texts))
        for status, rows in rows_by_status:
            for t, d in rows:
                typer.echo(f"{status}\t{t}\t{d}")
    _say(f"restored {len(report.ready) + len(report.queued)} record(s) ({len(report.ready)} ready, "
         f"{len(report.queued)} queued); {report.kept} already indexed; {len(report.corrupt_texts)} corrupt "
         "text(s) skipped (re-ingest them)")

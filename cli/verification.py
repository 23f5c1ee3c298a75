"""``kvlink-rag verify``: batched, prefix-shared serving against one request at a time (:mod:`service.verify`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from cli.common import NQ_DEFAULT, NqOpt, console, fail, make_engine, make_settings, out, results_only_stdout

app = typer.Typer()


@app.command()
def verify(
    nq: NqOpt = NQ_DEFAULT,
    questions: Annotated[int, typer.Option(help="NQ dev questions in the sample (1-64).")] = 8,
    docs: Annotated[int, typer.Option(help="Documents per question (gold passage among distractors).")] = 10,
    max_new_tokens: Annotated[int, typer.Option(help="Generated tokens compared per request.")] = 16,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the rows here.")] = None,
) -> None:
    """Check that batched, prefix-shared answers equal one-at-a-time ones: per request the max |logit
    difference|, the cosine of the prompt's last-layer KV and whether greedy tokens agree."""
    if not 1 <= questions <= 64 or not 1 <= docs <= 20 or not 1 <= max_new_tokens <= 256:
        fail("--questions must be 1-64, --docs 1-20, --max-new-tokens 1-256")
    if not nq.exists():
        fail(f"NQ file not found: {nq} (give --nq)")
    from evaluation.nq import build_documents, load_nq
    from service.verify import as_rows, verify as run_verify

    examples = load_nq(nq, limit=max(questions, 200))
    engine = make_engine(make_settings())
    cases = [(examples[i].question, build_documents(examples, i, docs)[0]) for i in range(questions)]
    with results_only_stdout():
        rows = as_rows(run_verify(engine, cases, max_new_tokens))
    table = Table(title=f"batched + shared vs one at a time ({questions} NQ questions, {docs} documents)")
    for col in ("#", "max |dlogit|", "key cos", "value cos", "greedy agree", "tokens", "tree tokens"):
        table.add_column(col)
    for i, r in enumerate(rows):
        table.add_row(str(i), f"{r['max_abs_logit_diff']:.2e}", f"{r['key_cosine']:.6f}", f"{r['value_cosine']:.6f}",
                      "yes" if r["greedy_agree"] else "NO", str(r["tokens"]), str(r["tree_tokens"]))
    out.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(rows, indent=2))
    if not all(r["greedy_agree"] for r in rows):
        console.print("greedy tokens differ for some requests")
        raise typer.Exit(1)

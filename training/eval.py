"""Answer-quality evaluation: full prefill vs reused caches (naive, linked, adapted) on multi-document NQ.

Metric: best_subspan_em (Liu et al., 2023; KVLink, arXiv 2502.16002, section 4) with a 95% bootstrap
interval, the mean negative log-likelihood (nats/token) of the first gold answer given the context, and
the median TTFT. Rows are appended to a JSONL file as they are computed, so a long run can resume.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from evaluation.nq import NQExample, best_subspan_em, build_documents
from kvlink_rag.decoding.generate import SamplingParams, decode, full_prefill
from kvlink_rag.engine import Engine
from kvlink_rag.explain.answers import attribution, explaining
from kvlink_rag.linking.kvcache import truncate_cache
from kvlink_rag.model.lora import adapter_scope
from kvlink_rag.text.prompt import encode_user_text
from kvlink_rag.types import Document

from .modes import EVAL_POSITIONS, FULL_MODES, MODES, ROTATION, Retention  # noqa: F401 - re-exported

ROW_FIELDS = frozenset({"index", "gold_position", "mode", "em", "nll", "ttft_s"})


def position_for(gold_position: str, index: int) -> str:
    """The gold position of question ``index``: ``rotate`` puts question i at first/middle/last in turn
    (so n questions cover each position n/3 times at the cost of one pass); others are returned as is."""
    return ROTATION[index % len(ROTATION)] if gold_position == "rotate" else gold_position


def read_rows(paths: list[Path]) -> list[dict]:
    """Rows of one or more ``*.rows.jsonl`` files; a later file's row for the same (question, position,
    mode) replaces an earlier one.

    Raises:
        ValueError: a file is missing, not JSON lines, or a row lacks a field.
    """
    merged: dict[tuple, dict] = {}
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"{path} does not exist")
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            missing = ROW_FIELDS - set(r) if isinstance(r, dict) else ROW_FIELDS
            if missing:
                raise ValueError(f"{path}:{n}: not an eval row (missing {', '.join(sorted(missing))})")
            merged[(r["index"], r["gold_position"], r["mode"])] = r
    return list(merged.values())


@dataclass
class ModeResult:
    """Per-question scores of one mode."""

    em: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)

    def summary(self, seed: int = 0) -> dict:
        """``{"accuracy", "ci95", "answer_nll", "ttft_s", "n"}`` (means; ttft median), and ``bytes_per_doc``
        (mean) when the rows carry it."""
        n = len(self.em)
        lo, hi = bootstrap_ci(self.em, seed=seed)
        out = {"accuracy": sum(self.em) / n if n else 0.0, "ci95": [lo, hi],
               "answer_nll": sum(self.nll) / n if n else 0.0,
               "ttft_s": sorted(self.ttft)[n // 2] if n else 0.0, "n": n}
        if self.bytes:
            out["bytes_per_doc"] = sum(self.bytes) / len(self.bytes)
        return out


def bootstrap_ci(values: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``values``."""
    if not values:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    return means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


def document_bytes(engine: Engine, ctx, n_docs: int) -> float:
    """Mean KV bytes per document a linked context holds (kept tokens x layers x kv heads x head dim x 2 (K, V)
    x the stored dtype's bytes): what a retention read moves from the store."""
    spans = [(s.start, s.end) for s in ctx.segments if s.kind == "document"]
    pos = ctx.storage_positions
    kept = sum(int(((pos >= a) & (pos < b)).sum()) for a, b in spans)
    cfg = engine.lm.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2
    elem = 2 if engine.settings.kv_dtype in ("bfloat16", "float16") else 4
    return kept * per_token * elem / max(1, n_docs)


def mode_k(mode: str) -> int | None:
    """Link tokens a linked ``mode`` uses: 0 for naive reuse and CacheBlend, None (the engine's K) otherwise."""
    return 0 if mode.startswith(("naive", "cacheblend")) else None


@torch.inference_mode()  # the adapter's parameters require grad: no graph for the answer's scoring forward
def score_mode(engine: Engine, mode: str, question: str, docs: list[Document], answer: str,
               max_new_tokens: int, retention: Retention = Retention()) -> dict:
    """One question under one mode: ``{"answer", "ttft_s", "nll"}`` (and ``bytes_per_doc`` for linked modes).

    TTFT covers cache lookup/load, linking (or full prefill) and the first token; the answer NLL is
    scored on the same cache, which is then truncated back before greedy decoding.
    """
    lm = engine.lm
    k = mode_k(mode)
    with adapter_scope(lm, engine.adapter), \
            (explaining(engine, docs, k) if retention.explain else nullcontext()) as mass:
        t0 = time.perf_counter()
        if mode in FULL_MODES or not docs:  # no documents (eval --retrieve kept none): the question alone
            ctx = full_prefill(lm, engine.prompt_ids(question, docs))
        else:
            ctx, _ = engine.link_context(question, docs, k=k, retention=retention.r, method=retention.method,
                                         recompute_ratio=retention.recompute_ratio)
        first = int(torch.argmax(ctx.last_logits))
        ttft = time.perf_counter() - t0
        if mass is not None:
            mass.active = False  # the reference answer's forward is not the model's answer
        ans = encode_user_text(lm.tokenizer, answer)
        n_cached = ctx.storage_positions.numel()
        pos = torch.arange(ctx.next_position, ctx.next_position + len(ans))
        out = lm.model(input_ids=ans[None].to(lm.device), position_ids=pos[None].to(lm.device), cache=ctx.cache,
                       use_cache=True)
        logits = torch.cat([ctx.last_logits[None], out.logits[0, :-1].float()])
        nll = float(F.cross_entropy(logits.cpu(), ans))
        truncate_cache(ctx.cache, n_cached)
        params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=engine.stop_ids)
        if mass is not None:
            mass.active = True
        ids = list(decode(lm, ctx, params))
    assert not ids or ids[0] == first
    extra = {} if mode in FULL_MODES or not docs else {"bytes_per_doc": document_bytes(engine, ctx, len(docs)),
                                           "retention": retention.r, "method": retention.method,
                                           "recompute_ratio": retention.recompute_ratio}
    if mass is not None:
        att = attribution(engine, mass, ctx, docs)
        extra.update(attribution=[d.share for d in att.documents], prefix_share=att.prefix,
                     passage_peak=[d.share * (d.passages[0][2] if d.passages else 0.0) for d in att.documents])
    return {"answer": lm.tokenizer.decode(ids, skip_special_tokens=True).strip(), "ttft_s": ttft, "nll": nll,
            **extra}


def evaluate(engines: dict[str, Engine], examples: list[NQExample], n: int, n_docs: int, gold_positions: list[str],
             seed: int = 0, max_new_tokens: int = 24, rows_path: Path | None = None, progress=None,
             retentions: dict[str, Retention] | None = None,
             build: Callable[..., tuple[list[Document], int]] = build_documents,
             metric: Callable[[str, list[str]], float] = best_subspan_em, start: int = 0,
             tag: str = "") -> list[dict]:
    """Score every mode in ``engines`` (mode -> engine) on questions ``start..n-1`` at each gold position
    (``EVAL_POSITIONS``; a row records the actual position, see :func:`position_for`); ``retentions`` gives
    a linked mode's retention (mode label -> :class:`Retention`, default every token). ``build`` and
    ``metric`` make the task: NQ's by default (:func:`evaluation.nq.build_documents`, best_subspan_em);
    :mod:`training.kv_retrieval`'s ``build_documents`` and ``exact_match`` for key-value retrieval;
    :func:`training.long_docs.long_documents` for one long document per question (a row's ``em`` is the
    metric's score). ``start`` > 0 shards a run across processes (their row files merge: ``eval-report``);
    ``tag`` is appended to each row's mode label (``linked-query-lora@rank32``), so runs of the same mode with
    other artifacts merge side by side.

    Documents are precomputed before timing (as at ingest), so TTFT measures reuse. Rows already in
    ``rows_path`` (same question, position, mode) are kept and skipped. Returns all rows.
    """
    rows: list[dict] = []
    done: set[tuple] = set()
    if rows_path is not None and rows_path.exists():
        rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
        done = {(r["index"], r["gold_position"], r["mode"]) for r in rows}
    sink = open(rows_path, "a") if rows_path is not None else None
    try:
        for layout in gold_positions:
            for i in range(start, n):
                ex, pos = examples[i], position_for(layout, i)
                docs, slot = build(examples, i, n_docs, pos, seed)
                for mode, eng in engines.items():
                    if (i, pos, mode + tag) in done:
                        continue
                    if mode not in FULL_MODES:  # refused from token counts before any document is encoded
                        eng.check_fits(docs, len(eng.template.question_ids(eng.lm.tokenizer, ex.question)), mode_k(mode))
                        for d in docs:
                            eng.warm(d)  # each chunk of a chunked document
                    r = score_mode(eng, mode, ex.question, docs, ex.answers[0], max_new_tokens,
                                   (retentions or {}).get(mode, Retention()))
                    row = {"index": i, "gold_position": pos, "gold_slot": slot, "mode": mode + tag,
                           "em": metric(r["answer"], ex.answers), **r}
                    rows.append(row)
                    if sink is not None:
                        sink.write(json.dumps(row) + "\n")
                        sink.flush()
                if progress is not None:
                    progress()
    finally:
        if sink is not None:
            sink.close()
    return rows


def summarise(rows: list[dict], seed: int = 0) -> dict:
    """``{"modes": {mode: summary}, "by_position": {position: {mode: summary}}}``."""
    def collect(selected):
        out: dict[str, ModeResult] = {}
        for r in selected:
            m = out.setdefault(r["mode"], ModeResult())
            m.em.append(r["em"])
            m.nll.append(r["nll"])
            m.ttft.append(r["ttft_s"])
            if "bytes_per_doc" in r:
                m.bytes.append(r["bytes_per_doc"])
        return {k: v.summary(seed) for k, v in out.items()}

    positions = sorted({r["gold_position"] for r in rows})
    return {"modes": collect(rows), "by_position": {p: collect([r for r in rows if r["gold_position"] == p])
                                                    for p in positions}}


def paired_difference(rows: list[dict], mode: str, baseline: str, scale: float = 1.0, reps: int = 2000,
                      seed: int = 0, field: str = "em") -> tuple[float, float, float] | None:
    """Mean of ``field(mode) - scale * field(baseline)`` (``em``: accuracy; ``nll``: answer NLL, nats/token)
    over the questions (index, position) both modes answered, with its 95% percentile-bootstrap interval
    (questions resampled in pairs); None if they share no question. ``scale=0.95`` tests "at least 95% of
    the baseline"."""
    a = {(r["index"], r["gold_position"]): r[field] for r in rows if r["mode"] == mode}
    b = {(r["index"], r["gold_position"]): r[field] for r in rows if r["mode"] == baseline}
    diffs = [a[k] - scale * b[k] for k in sorted(a.keys() & b.keys())]
    if not diffs:
        return None
    lo, hi = bootstrap_ci(diffs, reps, seed)
    return sum(diffs) / len(diffs), lo, hi


def summary_markdown(summary: dict) -> str:
    """Markdown table of a :func:`summarise` result: per mode accuracy [95% CI], answer NLL, median TTFT,
    n, and accuracy [95% CI] per gold position when there are several."""
    positions = [p for p in ("first", "middle", "last", "random") if p in summary.get("by_position", {})]
    per_pos = positions if len(positions) > 1 else []
    head = ["mode", "accuracy [95% CI]", "answer NLL (nats/token)", "median TTFT s", "n"] + [f"{p} [95% CI]" for p in per_pos]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def acc(s: dict) -> str:
        return f"{s['accuracy']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"

    for m, s in summary["modes"].items():
        cells = [m, acc(s), f"{s['answer_nll']:.3f}", f"{s['ttft_s']:.3f}", str(s["n"])]
        cells += [acc(summary["by_position"][p][m]) if m in summary["by_position"][p] else "-" for p in per_pos]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_by_position(summary: dict, path: Path) -> None:
    """PNG: accuracy (with 95% CI) by gold position, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [p for p in ("first", "middle", "last", "random") if p in summary["by_position"]]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    modes = list(summary["modes"])
    for m in modes:
        ys = [summary["by_position"][p].get(m, {}).get("accuracy", float("nan")) for p in order]
        lo = [y - summary["by_position"][p][m]["ci95"][0] for y, p in zip(ys, order)]
        hi = [summary["by_position"][p][m]["ci95"][1] - y for y, p in zip(ys, order)]
        ax.errorbar(order, ys, yerr=[lo, hi], marker="o", capsize=3, label=m)
    ax.set_xlabel("gold passage position")
    ax.set_ylabel("accuracy (best_subspan_em)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

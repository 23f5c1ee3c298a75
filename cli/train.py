"""``kvlink-rag train-links``: train link tokens and a query-side LoRA on NQ (variants of issue 17:
``--init``, ``--curriculum``, ``--doc-side``, best-validation artifacts)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from cli.common import NQ_DEFAULT, EncOpt, NqOpt, checked_doc_cache, console, doc_cache_engine, fail, make_settings, \
    progress_bar, results_only_stdout
from cli.train_options import MIX, Bf16Opt, CheckpointOpt, DeviceOpt, FastAttentionOpt, LinkInitOpt, MixKvAnswerOpt, \
    MixKvDocsOpt, MixLongOpt, MixNqDocsOpt, MixPoolOpt, MixRetentionsOpt, MixtureOpt, PackOpt, PreencodeOpt, \
    issue28_options, parse_mixture
from kvlink_rag.model.family import ModelFamily

if TYPE_CHECKING:
    from service.settings import Settings

TrainDocCacheOpt = Annotated[str, typer.Option(
    help="memory: document encodings memoised in this process only; store: kept in the document store under "
    "KVLINK_RAG_HOME, so later runs (other variants, other processes) read them instead of encoding again "
    "(~4 GB for the NQ training passages).")]

StepsOpt = Annotated[int, typer.Option(help="Optimiser steps (each over --accumulate examples); 550 made the shipped "
                                       "artifact (validation stopped improving there, EVALUATION.md).")]

InitOpt = Annotated[Optional[Path], typer.Option(help="Start from this saved artifact (same K, slots, rank, targets) "
                                              "with a fresh optimiser; --steps more steps, on the examples after "
                                              "those it was trained on.")]
ValEveryOpt = Annotated[int, typer.Option(help="Validation answer NLL every N steps (and at the start and end; "
                                          "0: never, the last step's artifact is saved); the best step's artifact "
                                          "is saved as --out. The greedy accuracy on the held-out questions at "
                                          "the end runs either way.")]
CurriculumOpt = Annotated[Optional[str], typer.Option(help="MIN-MAX: documents per training example drawn per "
                                                     "example in [MIN, MAX] instead of --docs (validation: --docs).")]
TimeLimitOpt = Annotated[float, typer.Option(help="Stop after this many seconds of training (validated, saved; "
                                             "rerun to resume); 0: no limit.")]
DocSideOpt = Annotated[bool, typer.Option("--doc-side", help="The adapter encodes documents too (gradients through "
                                          "the document encodings); an upper bound: such caches depend on the "
                                          "adapter, so only `eval` takes the artifact.")]

# LoRA targets of the shipped artifact: MLP projections added to q/k/v/o lowered held-out answer NLL most of the
# variants measured side by side (issue 17, EVALUATION.md)
SHIPPED_TARGETS = ",".join(ModelFamily.attention_targets + ModelFamily.mlp_targets)  # the default layout's names

app = typer.Typer()


@app.command("train-links")
def train_links(
    data: NqOpt = NQ_DEFAULT,
    out: Annotated[Path, typer.Option(help="Output safetensors (link tokens + adapter).")] = Path("links.safetensors"),
    name: Annotated[Optional[str], typer.Option(help="Save as the named adapter $KVLINK_RAG_HOME/links/NAME.safetensors "
                                                "(instead of --out), selectable per query.")] = None,
    steps: StepsOpt = 550,
    k: Annotated[int, typer.Option("--k", help="Link tokens per document.")] = 5,
    docs: Annotated[int, typer.Option("--docs", help="Documents per training example (gold + distractors).")] = 10,
    lr: Annotated[float, typer.Option(help="LoRA learning rate.")] = 3e-4,
    link_lr: Annotated[float, typer.Option(help="Link-embedding learning rate.")] = 1e-3,
    accumulate: Annotated[int, typer.Option(help="Examples per optimiser step (gradient accumulation).")] = 4,
    adapter: Annotated[str, typer.Option(help="query-lora (link tokens + query-side LoRA) or none.")] = "query-lora",
    lora: Annotated[bool, typer.Option("--lora", help="Same as --adapter query-lora.")] = False,
    rank: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    targets: Annotated[str, typer.Option(help="LoRA target projections, comma-separated (the shipped recipe: "
                                         "attention and MLP).")] = SHIPPED_TARGETS,
    slots: Annotated[int, typer.Option(help="1: link tokens shared by every document slot; S: per-slot "
                                       "[S, K, hidden] (slot i >= S uses the last).")] = 1,
    exclude_first: Annotated[int, typer.Option(help="Questions reserved for evaluation (not trained on).")] = 500,
    val_n: Annotated[int, typer.Option(help="Held-out validation questions (end of the file).")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of example order, distractors and initialisation (runs are deterministic).")] = 0,
    encoding: EncOpt = None,
    init: InitOpt = None,
    val_every: ValEveryOpt = 50,
    curriculum: CurriculumOpt = None,
    time_limit: TimeLimitOpt = 0.0,
    doc_cache: TrainDocCacheOpt = "memory",
    doc_side: DocSideOpt = False,
    # issue 28 (cli.train_options): the task mixture, speed switches, link-token init, device, checkpoint folder
    mixture: MixtureOpt = None, mix_nq_docs: MixNqDocsOpt = MIX.nq_docs, mix_kv_docs: MixKvDocsOpt = MIX.kv_docs,
    mix_pool: MixPoolOpt = MIX.pool, mix_long_passages: MixLongOpt = MIX.long_passages,
    mix_retentions: MixRetentionsOpt = MIX.retentions, mix_kv_answer: MixKvAnswerOpt = MIX.kv_answer,
    pack: PackOpt = False, fast_attention: FastAttentionOpt = False, bf16: Bf16Opt = False, preencode: PreencodeOpt = False,
    link_init: LinkInitOpt = "separator", device: DeviceOpt = None, checkpoint: CheckpointOpt = None,
) -> None:
    """Train link tokens and a query-side LoRA on NQ; resumable.

    Trains on multi-document QA examples and saves link tokens (and the adapter) as one safetensors file:
    the best validation step's (the last one's beside it as <out>-last), the curve in <out>.json.
    """
    from evaluation.nq import DataFormatError
    from training.data import split_examples

    out, target_list = _train_checks(out, name, adapter, targets, steps, k, docs, accumulate, slots, rank)
    span = _train_variant_checks(init, val_every, curriculum, doc_side, lora or adapter == "query-lora")
    stored_docs = checked_doc_cache(doc_cache)
    mix = parse_mixture(mixture, mix_nq_docs, mix_kv_docs, mix_pool, mix_long_passages, mix_retentions, docs,
                        mix_kv_answer)
    cfg28, settings28 = issue28_options(mix, pack, fast_attention, bf16, link_init, device, doc_side)
    try:
        split = split_examples(data, exclude_first, val_n)
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    from training.train_config import TrainConfig

    cfg = TrainConfig(steps=steps, accumulate=accumulate, k=k, docs=docs, lr=lr, link_lr=link_lr,
                      lora=lora or adapter == "query-lora", rank=rank, alpha=2 * rank, targets=target_list,
                      slots=slots, seed=seed, init=str(init) if init else "", curriculum=span, doc_side=doc_side, **cfg28)
    _train(make_settings(k, encoding, shipped_links=False, **settings28), split, cfg, out, val_every, time_limit,
           stored_docs, preencode, checkpoint)


def _train_checks(out: Path, name: str | None, adapter: str, targets: str, *counts: int) -> tuple[Path, tuple[str, ...]]:
    """``train-links``' output path (``--name`` resolved) and LoRA targets, its arguments checked; or exit."""
    if adapter not in ("query-lora", "none"):
        fail(f"unknown adapter {adapter!r}; choose query-lora or none")
    if name is not None:
        from kvlink_rag.adapter_registry import adapter_path

        try:
            out = adapter_path(make_settings().links_dir, name)
        except ValueError as e:
            fail(str(e))
    if min(counts) < 1:
        fail("--steps, --k, --docs, --accumulate, --slots and --rank must be >= 1")
    target_list = tuple(x.strip() for x in targets.split(",") if x.strip())
    if not target_list:
        fail("--targets needs at least one projection name, e.g. q_proj,v_proj")
    return out, target_list


def _train_variant_checks(init: Path | None, val_every: int, curriculum: str | None, doc_side: bool,
                          lora: bool) -> tuple[int, int] | None:
    """``--init``, ``--val-every``, ``--doc-side`` checked and ``--curriculum MIN-MAX`` parsed; or exit."""
    if init is not None and not init.is_file():
        fail(f"--init {init}: no such file")
    if val_every < 0:
        fail("--val-every must be >= 0")
    if doc_side and not lora:
        fail("--doc-side trains the adapter on document tokens; it needs --adapter query-lora")
    if curriculum is None:
        return None
    lo, _, hi = curriculum.partition("-")
    if not (lo.strip().isdigit() and hi.strip().isdigit()) or not 1 <= int(lo) <= int(hi):
        fail(f"--curriculum {curriculum!r}: expected MIN-MAX with 1 <= MIN <= MAX, e.g. 1-20")
    return int(lo), int(hi)


def _train(settings: Settings, split, cfg, out: Path, val_every: int = 50, time_limit: float = 0.0,
           stored_docs: bool = False, preencode: bool = False, checkpoint: Path | None = None) -> None:
    """Train (resuming from ``<out>.ckpt``), validate and save the best artifact, the loss curve and the summary;
    document encodings memoised in memory, or with ``stored_docs`` read from and written to the store (untracked)."""
    from kvlink_rag.types import ContextTooLong
    from training.loop import Trainer
    from training.outputs import save_outputs

    engine = doc_cache_engine(settings, stored_docs)
    try:
        trainer = Trainer(engine, split, cfg, checkpoint or out.with_suffix(".ckpt"))
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    if trainer.state.step:
        console.print(f"resuming from step {trainer.state.step} of {cfg.steps} ({trainer.checkpoint_path})")
    if preencode:
        _preencode(trainer, settings.store_max_bytes if stored_docs else None)
    last = trainer.state.losses[-1] if trainer.state.losses else float("nan")
    with progress_bar("training link tokens", cfg.steps, completed=trainer.state.step, loss=last) as bar, \
            results_only_stdout():
        try:
            trainer.run(lambda step, loss: bar.update(completed=step, loss=loss), val_every=val_every,
                        max_seconds=time_limit)
        except ContextTooLong as e:  # one drawn example longer than the estimate check_context allowed
            fail(f"{e} (stopped at step {trainer.state.step}; the last checkpoint resumes)")
    s = save_outputs(trainer, split, out, {"encoding": settings.encoding})
    chosen = (f"best validation step {s['best_step']} of {s['steps']}" if s["best_step"] is not None
              else f"the last step, {s['steps']}: no validation NLL was measured")
    console.print(f"saved {out} (K={cfg.k}, adapter={'query-lora' if cfg.lora else 'none'}, {chosen}), "
                  f"validation accuracy {s['val_accuracy_best']:.3f} on "
                  f"{s['val_n']} held-out questions; {s['seconds_per_step'] or 0:.2f} s/step on {s['device']}; "
                  f"curve {out.with_suffix('.json')}")


def _preencode(trainer, capacity: int | None) -> None:
    """Encode every document of the run's remaining steps and of validation once (:mod:`training.train_model`);
    with ``capacity`` (the store's limit, bytes) exit first when their KV would not fit in it, since the store
    would then evict the first documents to make room for the last and the steps would encode them again."""
    import time

    from training.samples import run_documents
    from training.train_model import distinct, preencode, stored_kv_bytes

    t0 = time.perf_counter()
    docs = distinct(run_documents(trainer))
    if capacity is not None:
        need = stored_kv_bytes(trainer.engine, docs)
        if need > 0.9 * capacity:  # ~10% for record framing and LMDB's pages
            fail(f"--preencode: the run's {len(docs)} documents hold {need / 2**20:,.0f} MiB of KV, more than 90% of "
                 f"the store's limit of {capacity / 2**20:,.0f} MiB (KVLINK_RAG_STORE_MAX_BYTES): the store would evict "
                 "documents the run still needs; raise the limit or lower --mix-pool")
    with results_only_stdout():
        seen, encoded = preencode(trainer.engine.warm, docs)
    console.print(f"pre-encoded {encoded} of {seen} documents in {time.perf_counter() - t0:.0f} s")

"""Training of link-token embeddings ``[K, hidden]`` (optionally with a query-side LoRA adapter).

Loss: cross-entropy on the answer tokens under the linked layout (KVLink, arXiv 2502.16002, section 3.2),
documents encoded apart by the frozen base model (their caches are precomputed and detached), link
tokens attending across documents, question and answer attending to all. Gradients reach the link
embeddings and, with LoRA, the adapter that is active for link, question and answer tokens only; with
``doc_side`` the adapter is on for document tokens too and gradients run through the document encodings
(:mod:`kvlink_rag.reuse.doc_side`, an upper bound: such caches depend on the adapter).

Validation answer NLL is measured at the start and every ``val_every`` steps; the parameters of the best
validation step are kept (and checkpointed) beside the last ones.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from evaluation.nq import NQExample, TooFewDistractors, build_documents
from kvlink_rag.engine import Engine
from kvlink_rag.linking.link_tokens import LinkTokens, initial_link_tokens
from kvlink_rag.model.loader import LoadedModel
from kvlink_rag.model.lora import adapter_scope, add_lora, lora_state

from .data import Split, check_context
from .example_loss import example_loss
from .fast_attention import training_attention
from .mixture import Sample
from .packed import packed_loss
from .samples import pack_item, sample_of, train_sample_at, validate_tasks
from .train_config import TRAIN_ADAPTER, TrainConfig, TrainState, comparable
from .train_forward import TrainForward
from .train_model import bf16_gemms

class Trainer:
    """Owns the trainable tensors, the optimiser and checkpoints for one training run.

    Args:
        engine: engine over the base model (its cache memoises document encodings).
        split: training / validation examples.
        cfg: hyper-parameters.
        out_dir: checkpoint folder (``checkpoint.pt``); an existing checkpoint is resumed.

    Raises:
        ContextTooLong: a typical example of ``cfg.docs`` (or the curriculum's most) documents would not fit
            the model's context (:func:`training.data.check_context`).
        ValueError: the checkpoint in ``out_dir`` was made with other settings.
    """

    def __init__(self, engine: Engine, split: Split, cfg: TrainConfig, out_dir: Path):
        self.engine, self.split, self.cfg, self.out_dir = engine, split, cfg, Path(out_dir)
        self.mixture = cfg.mixture.check() if cfg.mixture is not None else None
        most = self.mixture.max_docs if self.mixture else cfg.curriculum[1] if cfg.curriculum else cfg.docs
        check_context(engine, split, most, cfg.k, cfg.max_answer_tokens)
        torch.manual_seed(cfg.seed)
        self.lm = engine.lm  # the link-and-question forward's model
        order = list(range(len(split.train)))
        random.Random(cfg.seed).shuffle(order)
        self.order = order
        self.link_embeds = torch.nn.Parameter(self._initial_links().to(engine.lm.device))
        groups = [{"params": [self.link_embeds], "lr": cfg.link_lr}]
        self.adapter = None
        if cfg.lora:
            if TRAIN_ADAPTER not in self.lm.adapters:
                add_lora(self.lm, TRAIN_ADAPTER, cfg.rank, cfg.alpha, cfg.targets)
            self.adapter = TRAIN_ADAPTER
            with adapter_scope(self.lm, TRAIN_ADAPTER):
                lora_params = [p for n, p in self.lm.model.named_parameters() if f".{TRAIN_ADAPTER}." in n]
            for p in lora_params:
                p.requires_grad_(True)
            groups.append({"params": lora_params, "lr": cfg.lr})
        self.params = [p for g in groups for p in g["params"]]
        self.opt = torch.optim.AdamW(groups, weight_decay=0.0, fused=True)  # one kernel: 20 -> 5 ms a step here
        self.state = TrainState()
        self.best_params: list[torch.Tensor] | None = None
        self.best_by_task: dict[str, list[torch.Tensor]] = {}
        self.init_steps, self.example_offset = 0, 0
        self._train_forward: TrainForward | None = None
        if cfg.init:
            from .warm_start import warm_start

            self.init_steps, self.example_offset = warm_start(self, Path(cfg.init))
        self._resume()

    def _initial_links(self) -> torch.Tensor:
        """``[(S,) K, hidden]`` float32 starting link embeddings (``cfg.link_init``). Raises ValueError: unknown."""
        cfg = self.cfg
        if cfg.link_init == "separator":
            return initial_link_tokens(self.engine.lm, cfg.k, slots=cfg.slots).embeds.clone()
        if cfg.link_init == "document":
            from .link_init import document_link_init

            docs = [self.split.train[i].gold for i in self.order[:64]]
            return document_link_init(self.engine, docs, cfg.k, cfg.slots, seed=cfg.seed)
        raise ValueError(f"unknown link init {cfg.link_init!r}; choose separator or document")

    # -- checkpoints -----------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / "checkpoint.pt"

    def _resume(self) -> None:
        if not self.checkpoint_path.exists():
            return
        ck = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
        if comparable(ck["config"]) != comparable(asdict(self.cfg)):
            raise ValueError(f"checkpoint {self.checkpoint_path} was made with other settings; use another --out")
        with torch.no_grad():
            for p, saved in zip(self.params, ck["params"]):
                p.copy_(saved)
        self.opt.load_state_dict(ck["optimizer"])  # moves the moments to the parameters' device
        self.state = TrainState(**ck["state"])
        self.best_params = ck.get("best_params")
        self.best_by_task = ck.get("best_by_task") or {}

    def save_checkpoint(self) -> None:
        """Atomically write params, optimiser and state."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoint_path.with_suffix(".part")
        torch.save({"config": asdict(self.cfg),
                    "params": [p.detach().cpu() for p in self.params], "optimizer": self.opt.state_dict(),
                    "state": asdict(self.state), "best_params": self.best_params,
                    "best_by_task": self.best_by_task}, tmp)
        tmp.replace(self.checkpoint_path)

    # -- steps -----------------------------------------------------------------------------------
    def example(self, i: int) -> tuple[NQExample, list]:
        """The ``i``-th training example of the run (deterministic from the seed) and its documents: ``cfg.docs``
        of them, or with a curriculum a count drawn in ``[min, max]`` from a generator seeded by ``seed`` and ``i``."""
        n_docs = self.cfg.docs
        if self.cfg.curriculum:
            n_docs = random.Random(f"curriculum-{self.cfg.seed}-{i}").randint(*self.cfg.curriculum)
        for shift in range(len(self.order)):  # a question whose answer is in every passage is skipped
            idx = self.order[(i + shift) % len(self.order)]
            try:
                docs, _ = build_documents(self.split.train, idx, n_docs, "random", seed=self.cfg.seed + i)
            except TooFewDistractors:
                continue
            return self.split.train[idx], docs
        raise TooFewDistractors(f"no training question has {n_docs - 1} distractors without its answer")

    def sample(self, i: int) -> Sample:
        """The ``i``-th training example of the run as a :class:`training.mixture.Sample` (the mixture's, or
        :meth:`example`'s NQ example)."""
        return train_sample_at(self, i)

    def sample_loss(self, sample: Sample) -> torch.Tensor:
        """One example's mean answer NLL (graph kept): today's :func:`example_loss` path for a whole-document NQ
        example, else :func:`training.packed.packed_loss` of one item (the same function of the inputs)."""
        if sample.task == "nq" and sample.retention == 1.0 and (not self.cfg.pack or self.cfg.doc_side):
            return example_loss(self.engine, self.link_embeds, sample_of(sample), list(sample.docs), self.cfg,
                                self.lm)
        return packed_loss(self.lm, self.engine.prefix, [pack_item(self, sample)], self.link_embeds,
                           self.engine.anchored)

    def step(self) -> float:
        """One optimiser step over ``accumulate`` examples (one packed forward with ``cfg.pack``); returns the
        mean loss."""
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        first = self.example_offset + self.state.step * self.cfg.accumulate
        samples = [self.sample(first + j) for j in range(self.cfg.accumulate)]
        total = self._backward(samples)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.state.step += 1
        self.state.losses.append(total)
        if self.params[0].is_cuda:
            torch.cuda.synchronize()
        self.state.seconds += time.perf_counter() - t0
        return total

    def _backward(self, samples: list[Sample]) -> float:
        """One step's forward and backward over ``samples`` (gradients accumulated); returns the mean loss."""
        own = self.train_forward() if self.cfg.pack and not self.cfg.doc_side else None
        if own is not None:  # the adapter's tensors are read directly: no peft layer switched, no module patched
            items = [pack_item(self, s) for s in samples]  # may encode documents, with peft's layers turned off
            for p in self.params:  # which turns their requires_grad off: the trained tensors need it on
                p.requires_grad_(True)
            loss = packed_loss(self.lm, self.engine.prefix, items, self.link_embeds, self.engine.anchored, own,
                               self.adapter)
            loss.backward()
            return float(loss.detach())
        fast = (self.cfg.fast_attention or self.cfg.pack) and not self.cfg.doc_side
        bf16 = self.cfg.bf16 and not self.cfg.doc_side
        with adapter_scope(self.lm, self.adapter), training_attention(self.lm.model, fast or bf16, bf16), \
                bf16_gemms(self.lm.model, bf16):
            if self.cfg.pack and not self.cfg.doc_side:  # doc-side encodings keep their graph: one at a time
                loss = packed_loss(self.lm, self.engine.prefix, [pack_item(self, s) for s in samples],
                                   self.link_embeds, self.engine.anchored)
                loss.backward()
                return float(loss.detach())
            total = 0.0
            for s in samples:
                loss = self.sample_loss(s) / self.cfg.accumulate
                loss.backward()
                total += float(loss.detach())
            return total

    def train_forward(self) -> TrainForward | None:
        """The packed steps' :class:`training.train_forward.TrainForward` (made on first use; its GEMMs in bfloat16
        with ``cfg.bf16``), or None where they run through transformers' decoder (``cfg.own_forward`` False)."""
        if self.cfg.own_forward and self._train_forward is None:
            self._train_forward = TrainForward(self.lm, torch.bfloat16 if self.cfg.bf16 else self.lm.dtype)
        return self._train_forward if self.cfg.own_forward else None

    @torch.no_grad()
    def validation_loss(self, n: int | None = None) -> float:
        """Mean answer NLL (nats/token) over the validation examples (gold at a random slot)."""
        val = self.split.val[:n] if n else self.split.val
        losses = []
        with adapter_scope(self.lm, self.adapter):
            for i, ex in enumerate(val):
                docs, _ = build_documents(self.split.val + self.split.train, i, self.cfg.docs, "random", seed=1)
                losses.append(float(example_loss(self.engine, self.link_embeds, ex, docs, self.cfg, self.lm)))
        return sum(losses) / len(losses)

    def validate(self, n: int = 20) -> float:
        """Record the validation loss of the current step (first ``n`` validation examples; with a mixture
        the overall score of :func:`training.samples.validate_tasks`, each task's NLL recorded beside it); keep a
        copy of the parameters when it is the best so far."""
        val = validate_tasks(self, n) if self.mixture else self.validation_loss(n)
        self.state.val_losses.append((self.state.step, val))
        if self.state.best_val is None or val < self.state.best_val:
            self.state.best_step, self.state.best_val = self.state.step, val
            self.best_params = [p.detach().cpu().clone() for p in self.params]
        return val

    def use_best(self) -> bool:
        """Load the parameters of the best validation step (if any was measured); True if loaded."""
        if self.best_params is None:
            return False
        with torch.no_grad():
            for p, saved in zip(self.params, self.best_params):
                p.copy_(saved)
        return True

    def run(self, on_step: Callable[[int, float], None] | None = None, val_every: int = 50,
            val_n: int = 20, max_seconds: float = 0.0) -> TrainState:
        """Train until ``cfg.steps``, checkpointing every ``checkpoint_every`` steps; with ``val_every`` > 0 the
        validation loss (``val_n`` examples) is recorded at the start, every ``val_every`` steps and at the end.

        ``max_seconds`` > 0: stop (validated and checkpointed) after the first step that ends past that many
        seconds of this call; a rerun resumes from there.
        """
        t0 = time.perf_counter()
        if val_every and not self.state.val_losses:
            self.validate(val_n)  # the starting point: the initialisation or the --init artifact
        while self.state.step < self.cfg.steps:
            loss = self.step()
            out_of_time = max_seconds > 0 and time.perf_counter() - t0 > max_seconds
            last = self.state.step == self.cfg.steps or out_of_time
            if val_every and (self.state.step % val_every == 0 or last):
                self.validate(val_n)
            if self.state.step % self.cfg.checkpoint_every == 0 or last:
                self.save_checkpoint()
            if on_step is not None:
                on_step(self.state.step, loss)
            if out_of_time:
                break
        return self.state

    def artifact(self, metadata: dict) -> LinkTokens:
        """The trained link tokens (and adapter) as a shippable artifact."""
        lora = lora_state(self.lm, TRAIN_ADAPTER) if self.adapter else None
        cfg = {"rank": self.cfg.rank, "alpha": self.cfg.alpha, "targets": list(self.cfg.targets)} if lora else None
        meta = {"k": self.cfg.k, "steps": self.init_steps + self.state.step, "data_hash": self.split.data_hash,
                "train_config": json.loads(json.dumps(asdict(self.cfg))), "trained": True,
                "doc_side": self.cfg.doc_side,
                "examples_seen": self.example_offset + self.state.step * self.cfg.accumulate,
                **metadata}
        return LinkTokens(self.link_embeds.detach().cpu().float(), self.engine.lm.fingerprint, meta, lora, cfg)

"""Query-side LoRA adapters (peft) that can be switched per call on one shared model.

A query-side adapter is active for link tokens, question and answer only; documents are always encoded
with every adapter off, so stored caches stay valid across retraining and one store serves any number
of adapters (LoRA: Hu et al., 2021, arXiv 2106.09685).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .family import ModelFamily
from .loader import LoadedModel

DEFAULT_TARGETS = ModelFamily.attention_targets  # the attention projections of the default layout


def _tuner_layers(lm: LoadedModel) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in lm.model.modules() if isinstance(m, BaseTunerLayer)]


def add_lora(lm: LoadedModel, name: str, rank: int = 16, alpha: int = 32,
             targets: tuple[str, ...] = DEFAULT_TARGETS, state: dict[str, torch.Tensor] | None = None) -> None:
    """Inject a LoRA adapter ``name`` into ``lm.model`` in place (off until :func:`adapter_scope` turns it on).

    Args:
        rank, alpha: LoRA rank and scaling numerator (scale = alpha / rank).
        targets: names of the linear modules to adapt.
        state: adapter weights as returned by :func:`lora_state`; random-initialised B=0 LoRA if None.
    Raises:
        ValueError: an adapter with this name exists, or ``state`` does not fit.
    """
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    if name in lm.adapters:
        raise ValueError(f"adapter {name!r} is already loaded")
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")
    with warnings.catch_warnings():  # several named adapters on one model is the design, not a mistake
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute", category=UserWarning)
        inject_adapter_in_model(config, lm.model, adapter_name=name)
    if state is not None:
        result = set_peft_model_state_dict(lm.model, state, adapter_name=name)
        missing = [k for k in result.missing_keys if ".lora_" in k and f".{name}." in k]
        if missing or result.unexpected_keys:
            raise ValueError(f"adapter weights do not fit the model: missing {missing[:3]}, "
                             f"unexpected {list(result.unexpected_keys)[:3]}")
    lm.model.to(lm.device)
    lm.adapters.add(name)
    if lm.runner is not None:
        lm.runner.forget_adapters()
    for layer in _tuner_layers(lm):
        layer.enable_adapters(False)


def remove_lora(lm: LoadedModel, name: str) -> None:
    """Delete adapter ``name`` from ``lm.model`` (its LoRA weights are freed); every adapter stays off.

    Call it with no :func:`adapter_scope` open (under the lock that serialises model calls).

    Raises:
        KeyError: ``name`` is not loaded.
    """
    import warnings

    from peft.tuners.tuners_utils import BaseTunerLayer, delete_adapter

    if name not in lm.adapters:
        raise KeyError(f"adapter {name!r} is not loaded")
    with warnings.catch_warnings():  # "active adapter deleted, setting another": all stay disabled below
        warnings.simplefilter("ignore")
        delete_adapter(lm.model, adapter_name=name, prefix="lora_", layer_cls=BaseTunerLayer)
    lm.adapters.discard(name)
    if lm.runner is not None:
        lm.runner.forget_adapters()
    for layer in _tuner_layers(lm):
        layer.enable_adapters(False)


def lora_state(lm: LoadedModel, name: str) -> dict[str, torch.Tensor]:
    """The adapter's LoRA A/B weights (peft state-dict names, adapter name stripped)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(lm.model, adapter_name=name).items()}


@contextmanager
def runner_adapter(lm: LoadedModel, name: str | None) -> Iterator[None]:
    """Within the block the model runner applies adapter ``name`` (``lm.active_adapter``) and the peft layers
    of the transformers model are left as they are: for the runner's own forwards (the scheduler's steps),
    which read the adapter's tensors themselves. :func:`adapter_scope` also switches every peft layer (about
    210 for SmolLM2), ~20 ms a call on this CPU: a decode step's whole cost again.

    Raises:
        KeyError: ``name`` is not loaded.
    """
    if name is not None and name not in lm.adapters:
        raise KeyError(f"adapter {name!r} is not loaded")
    saved, lm.active_adapter = lm.active_adapter, name
    try:
        yield
    finally:
        lm.active_adapter = saved

def forward_scope(lm: LoadedModel, name: str | None, transformers_may_run: bool):
    """The adapter scope for a block of forwards: :func:`adapter_scope` where a transformers forward may run in it
    (its peft layers must follow), else :func:`runner_adapter` (the model runner reads the adapter itself: no ~210
    peft layers switched on entry and back on exit, ~12 ms a call on the development CPU, twice a one-request answer).

    Raises:
        KeyError: ``name`` is not loaded.
    """
    return adapter_scope(lm, name) if transformers_may_run else runner_adapter(lm, name)


@contextmanager
def adapter_scope(lm: LoadedModel, name: str | None) -> Iterator[None]:
    """Within the block, adapter ``name`` is the only one active (``None``: all adapters off); the model
    runner reads it from ``lm.active_adapter``.

    Raises:
        KeyError: ``name`` is not loaded.
    """
    if not lm.adapters:
        if name is not None:
            raise KeyError(f"adapter {name!r} is not loaded")
        yield
        return
    if name is not None and name not in lm.adapters:
        raise KeyError(f"adapter {name!r} is not loaded")
    layers = _tuner_layers(lm)
    saved = [(layer.active_adapters, layer.disable_adapters) for layer in layers]
    saved_active, lm.active_adapter = lm.active_adapter, name
    for layer in layers:
        if name is None:
            layer.enable_adapters(False)
        else:
            layer.set_adapter(name)
            layer.enable_adapters(True)
    try:
        yield
    finally:
        lm.active_adapter = saved_active
        for layer, (active, disabled) in zip(layers, saved):
            layer.set_adapter(active)
            layer.enable_adapters(not disabled)

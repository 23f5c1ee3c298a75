"""The engine's runtime: the product's own model runner (plain tensors, explicit position ids).

Split as nano-vllm splits its engine: :mod:`.weights` (a family's weights as plain tensors, fused
projections), :mod:`.linear` (weight formats), :mod:`.lora` (query-side adapters as low-rank terms),
:mod:`.model_runner` (the packed forward over ragged batches). transformers stays for configs,
tokenizers, chat templates and as the reference of the exactness tests.
"""

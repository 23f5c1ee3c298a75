"""The engine: continuous batching over the product's own model runner (plain tensors, explicit position ids).

Split as nano-vllm splits its engine:

- engine loop: :mod:`.scheduler` (the thread: admit, allot the step's tokens, one packed forward per
  adapter, sample, finish), :mod:`kvlink_rag.omp_pool` (other threads give back their OpenMP teams, so the scheduler's
  is the only one spinning);
- scheduling: :mod:`.waiting` (the waiting queue: which requests a step admits), :mod:`.admission` (the
  admission policy), :mod:`.step_budget` (chunked prefill mixed with decode);
- requests: :mod:`.gen_request` (request, handle, result), :mod:`.running` (a running request's state),
  :mod:`.request_layout` (its items, positions and KV), :mod:`.cancel` (cancellation);
- KV: :mod:`.ragged` (a request's KV sequence, packed batches, attention), :mod:`.prefix_tree` (the radix
  tree of shared KV);
- model runner: :mod:`.model_runner` (the packed forward), :mod:`.weights` (a family's weights as plain
  tensors, fused projections), :mod:`.linear` (weight formats), :mod:`.head` (a decode step's LM head),
  :mod:`.lora` (query-side adapters as low-rank terms), :mod:`.attention_probs` (explain),
  :mod:`.hf_cache` (one-request contexts).

transformers stays for configs, tokenizers, chat templates and as the reference of the exactness tests.
"""

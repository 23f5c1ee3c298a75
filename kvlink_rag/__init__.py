"""kvlink-rag core: position-free document KV caches, RoPE re-linking, link tokens, generation.

Rooms, lowest first (each imports only those below it; ``tests/test_architecture.py`` ``CORE_FLOORS``): the
kernel at this package's top (types, cache, retention, encodable, settings), :mod:`.model`, :mod:`.text`,
:mod:`.linking`, :mod:`.decoding`, :mod:`.reuse`, the :class:`~kvlink_rag.engine.Engine` facade
(:mod:`.engine`, :mod:`.engine_documents`), :mod:`.explain` and :mod:`.adapter_registry`; the batching
runtime (:mod:`.runtime`) spans them.

Method: KVLink (Yang et al., 2025, arXiv 2502.16002).
"""

__version__ = "0.1.0"

"""KVLink itself: RoPE removed and re-applied on explicit positions (:mod:`.rope`), the KVLink mask
(:mod:`.mask`), a document's precompute (:mod:`.document_prefill`), link tokens (:mod:`.link_tokens`), the
linker (:mod:`.linker`), the transformers cache builder (:mod:`.kvcache`) and the linked layout's types
(:mod:`.context`)."""

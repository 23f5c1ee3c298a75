"""The model: loading and fingerprinting (:mod:`.loader`), what the linker refuses (:mod:`.support`), the
family adapter that owns every layout assumption of a transformers checkpoint (:mod:`.family`, the
implementations in :mod:`.families`), GGUF conversion of the default model (:mod:`.convert`), query-side
LoRA (:mod:`.lora`) and attention capture (:mod:`.attention`: the eager-kernel switch explain and
importance scores need)."""

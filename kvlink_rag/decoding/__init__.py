"""Decoding from a linked context: sampling and the token loop (:mod:`.generate`), the decode-and-time loop
that makes an :class:`~kvlink_rag.decoding.answer.Answer` (:mod:`.answer`), stop strings
(:mod:`.stop_strings`), grammar-constrained output (:mod:`.grammar`) and logprob records (:mod:`.logprobs`)."""

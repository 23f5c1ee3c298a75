"""Explaining an answer: per-document attribution from attention mass (:mod:`.attribution`,
:mod:`.attention_rows` for the scheduler's rows), explained answers (:mod:`.answers`) and the leave-one-out
measure (:mod:`.leave_one_out`)."""

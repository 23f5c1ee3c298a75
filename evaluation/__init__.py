"""Evaluation data, outside the serving core: NQ-open examples, documents and the answer metric
(:mod:`.nq`) and long-document builders (:mod:`.long_docs`). Serving never imports it; the CLI, training,
bench and scripts do."""

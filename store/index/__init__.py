"""Document indexes: a record per (tenant, document) with its status, hashes and cache keys, and SimHash bands for
near-duplicates (:mod:`~store.index.document_index`); embedded in the LMDB store or in Redis."""

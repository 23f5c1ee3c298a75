"""Document KV store: cache keys, LMDB blobs, document index (embedded or Redis), memory tiers, int8.

Modules are imported lazily by their users; importing :mod:`store` itself loads nothing heavy.
"""

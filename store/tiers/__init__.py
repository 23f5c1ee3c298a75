"""Memory tiers in front of the blob store (device, host, cold) and their eviction policies, layer prefetch, and
the shared tier (a local LMDB read-through in front of a shared Redis, version fencing)."""

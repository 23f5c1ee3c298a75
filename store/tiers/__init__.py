"""Memory tiers in front of the blob store (device, host, cold), their eviction policies and events, layer
prefetch, and the shared tier (a local LMDB read-through in front of a shared Redis) with its circuit breakers."""

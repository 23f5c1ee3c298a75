"""``kvlink-rag bench``: TTFT, load bandwidth, precompute throughput, scaling — side by side in one run."""

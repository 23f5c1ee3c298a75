"""kvlink-rag core: position-free document KV caches, RoPE re-linking, link tokens, generation.

Method: KVLink (Yang et al., 2025, arXiv 2502.16002).
"""

__version__ = "0.1.0"

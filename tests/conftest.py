"""Test set-up: make tests/ importable (factories, reference) and keep torch on few threads."""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# KVLINK_RAG_TORCH_THREADS=1 when the suite runs beside another torch job (two 2-thread jobs oversubscribe 2 cores)
torch.set_num_threads(int(os.environ.get("KVLINK_RAG_TORCH_THREADS") or 2))


@pytest.fixture
def cluster(tmp_path):
    """A real 3-node Redis Cluster on loopback ports (no replicas), stopped after the test."""
    from redis_servers import RedisClusterNodes, need_redis_server

    need_redis_server()
    nodes = RedisClusterNodes(tmp_path / "cluster").start()
    yield nodes
    nodes.stop()

"""Test set-up: make tests/ importable (factories, reference) and keep torch on few threads."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

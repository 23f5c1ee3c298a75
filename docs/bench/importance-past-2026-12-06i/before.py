"""`kvlink-rag` with the importance mass formed over every key (the code before ``first_key``)."""
import sys

import kvlink_rag.runtime.model_runner as model_runner
from cli.main import app

_mass = model_runner.attention_mass
model_runner.attention_mass = lambda q, pieces, mask, scale, skip=0, exclude_self=False, first_key=0: _mass(
    q, pieces, mask, scale, skip, exclude_self)
sys.argv[0] = "kvlink-rag"
app()

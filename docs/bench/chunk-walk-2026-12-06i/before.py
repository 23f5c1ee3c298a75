"""`kvlink-rag` with each chunk's past built anew (the code before the chunk walk: every encode calls past_prefix)."""
import sys

import kvlink_rag.engine_documents as engine_documents
from cli.main import app
from kvlink_rag.linking.chunk_past import past_prefix

engine_documents.chunk_past = past_prefix
sys.argv[0] = "kvlink-rag"
app()

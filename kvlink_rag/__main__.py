"""``python -m kvlink_rag`` runs the CLI."""

from kvlink_rag.cli import app

app()

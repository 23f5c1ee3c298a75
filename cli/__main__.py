"""``python -m cli`` runs the ``kvlink-rag`` command line."""

from cli.main import app

app()

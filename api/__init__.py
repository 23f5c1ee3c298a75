"""The HTTP service (FastAPI): documents, queries, an OpenAI-compatible endpoint, health and metrics."""

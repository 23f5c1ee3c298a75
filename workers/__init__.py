"""Celery precompute workers: ``celery_app`` (configuration, no torch) and ``tasks`` (the precompute task)."""

"""Celery tasks: thin, idempotent wrappers around domain functions in ``apps/`` and ``gpu_trainer/``."""

"""The Celery app. Tasks live in ``workers/`` and call domain functions in ``apps/``."""

from __future__ import annotations

import os

from celery import Celery

from apps.common.observability import celery_signals  # noqa: F401  (request ids into tasks, task metrics, logs)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

TASK_MODULES = ["workers.ingest", "workers.serving", "workers.training", "workers.experiments", "workers.notifications"]

app = Celery("strop", include=TASK_MODULES)
app.config_from_object("django.conf:settings", namespace="CELERY")

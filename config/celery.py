"""The Celery app. Tasks live in ``workers/`` and call domain functions in ``apps/``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

TASK_MODULES = ["workers.ingest", "workers.serving", "workers.training"]

app = Celery("strop", include=TASK_MODULES)
app.config_from_object("django.conf:settings", namespace="CELERY")

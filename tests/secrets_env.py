"""The test suite's own secrets, set before pytest-django loads the settings.

The suite sets DATABASE_URL, so the settings treat it as a deployment: with DEBUG off, every secret
the settings' table marks as required must be set, and none may be weak (config/secret_keys.py), and
password-reset mail must go by SMTP. pytest-django imports the settings before any conftest.py runs, so
this is a plugin that pyproject's addopts loads first (``-p tests.secrets_env``). It sets them in this
process's environment, which every process a test starts inherits (gunicorn, Celery workers,
``manage.py``, vLLM): all of them hash API keys with the same pepper and send vLLM the same key. A value
already in the environment wins.

The values are random, made anew for each session: no secret of the suite is written anywhere (the
repository is copied into the app image, and the settings refuse the fixed ones it once held, which
carried "strop-test"). The mail server is never reached: pytest-django swaps in the locmem backend.
"""

from __future__ import annotations

import os
import secrets

TEST_SECRETS = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "API_KEY_PEPPER": secrets.token_urlsafe(50),
    "ERASURE_MARK_KEY": secrets.token_urlsafe(50),
    "STORED_SECRETS_KEY": secrets.token_urlsafe(50),
    "VLLM_API_KEY": secrets.token_urlsafe(32),
    "EMAIL_HOST": "127.0.0.1",
}

for _name, _value in TEST_SECRETS.items():
    os.environ.setdefault(_name, _value)

"""The test suite's own secrets, set before pytest-django loads the settings.

The suite sets DATABASE_URL, so the settings treat it as a deployment: with DEBUG off, SECRET_KEY,
API_KEY_PEPPER and ERASURE_MARK_KEY must be set (config/secret_keys.py). pytest-django imports the
settings before any conftest.py runs, so this is a plugin that pyproject's addopts loads first
(``-p tests.secrets_env``).
It sets them in this process's environment, which every process a test starts inherits (gunicorn,
Celery workers, ``manage.py``): all of them hash API keys with the same pepper. A value already in the
environment wins. These values are public: they protect nothing but the test databases.
"""

from __future__ import annotations

import os

TEST_SECRETS = {
    "SECRET_KEY": "strop-test-suite-secret-key-YGxM7NoUzhhcMJFW-gl3nU2RtWhIBGHlK0GcrmaLHr_8ccjSromXwA",
    "API_KEY_PEPPER": "strop-test-suite-api-key-pepper-7jYMkXx7-KLDJlCfyOYqowG5n5eTsoot1bfiYPEarszZG-D480_ZA",
    "ERASURE_MARK_KEY": "strop-test-suite-erasure-mark-key-Qw3r7Yk2-vN9pLx4ZbT6mHc1JdF8sGe5RaU0oKiW-j",
}

for _name, _value in TEST_SECRETS.items():
    os.environ.setdefault(_name, _value)

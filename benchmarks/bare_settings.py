"""Strop's settings plus one bench-only route: the baseline that single feedback is compared with.

``POST /bench/bare-feedback`` is a bare Django view behind the same middleware, in the same
gunicorn, on the same database: it parses the JSON body and runs the feedback upsert Strop runs,
once, with no key, scope, rate limit, validation or lookup. Strop's /v1/feedback divided by this
is the share of a plain Django insert the real endpoint keeps on the same (noisy) machine.

Only benchmarks/ingest.py starts gunicorn with these settings (``DJANGO_SETTINGS_MODULE``).
"""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "benchmarks.bare_urls"

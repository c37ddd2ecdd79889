"""Strop settings, driven by environment variables (12-factor).

With no environment at all this is the *embedded default*: SQLite under ``var/`` and a
filesystem Celery broker, so one machine with nothing installed can run the API.
Production and the test suite set ``DATABASE_URL`` (Postgres) and ``REDIS_URL``.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

from config.celery_config import broker_transport_options, gpu_pools, task_queues
from config.env import database_from_url, env_bool, env_http_urls, env_int, env_list
from config.http_settings import CONTENT_SECURITY_POLICY, REST_FRAMEWORK, SPECTACULAR_SETTINGS  # noqa: F401 (settings)
from config.log_config import log_format, logging_config
from config.secret_keys import GENERATED, check_deployment, load_secrets
from config.serving_settings import *  # noqa: F403 (settings)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("STROP_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


DEBUG = env_bool("DEBUG", False)
# A deployment: DEBUG off and DATABASE_URL set. Every secret is checked at the end of this file
# (config/secret_keys.py, check_deployment): with DEBUG off none may be weak, and a deployment must set
# each one its table marks as required. The embedded default generates SECRET_KEY, API_KEY_PEPPER,
# ERASURE_MARK_KEY and STORED_SECRETS_KEY once under VAR_DIR. SECRET_KEY signs sessions and CSRF tokens.
# API keys are HMAC-SHA256(API_KEY_PEPPER, key): changing the pepper invalidates every issued key, so it
# is a secret of its own, rotated on its own.
STROP_DEPLOYED = not DEBUG and bool(os.environ.get("DATABASE_URL"))
_secrets = load_secrets(GENERATED, deployed=STROP_DEPLOYED, var_dir=VAR_DIR)
SECRET_KEY = _secrets["SECRET_KEY"]
API_KEY_PEPPER = _secrets["API_KEY_PEPPER"]
# Erasure marks (apps.training.erasure) are HMAC-SHA256(ERASURE_MARK_KEY, tenant:end user): a key of
# their own, so rotating SECRET_KEY keeps the marks; changing this one orphans every existing mark.
ERASURE_MARK_KEY = _secrets["ERASURE_MARK_KEY"]
# Secrets Strop stores and reads back (webhook signing secrets) are encrypted under this key
# (apps.common.stored_secrets); the fallbacks (comma-separated) still open what older keys sealed.
STORED_SECRETS_KEY = _secrets["STORED_SECRETS_KEY"]
STORED_SECRETS_KEY_FALLBACKS = env_list("STORED_SECRETS_KEY_FALLBACKS")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]

# HTTPS (platform/env.example). Off by default: the embedded default serves plain HTTP on loopback.
# Behind a TLS-terminating proxy, SECURE_PROXY_SSL_HEADER names the header it sets and the value that
# means HTTPS, Django-style ("HTTP_X_FORWARDED_PROTO,https"); only for a proxy that always sets it and
# drops a client's own.
_proxy_ssl_header = env_list("SECURE_PROXY_SSL_HEADER")
if _proxy_ssl_header and len(_proxy_ssl_header) != 2:
    raise ValueError("SECURE_PROXY_SSL_HEADER must be HEADER,VALUE, e.g. HTTP_X_FORWARDED_PROTO,https")
SECURE_PROXY_SSL_HEADER = (_proxy_ssl_header[0], _proxy_ssl_header[1]) if _proxy_ssl_header else None
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# The operator's own probes call these straight on the API's port, past the proxy, in plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^health$", r"^health/ready$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Cookies travel over HTTPS only once Strop knows it is served over HTTPS (either setting above).
_served_over_https = SECURE_SSL_REDIRECT or SECURE_PROXY_SSL_HEADER is not None
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _served_over_https)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _served_over_https)
SESSION_COOKIE_HTTPONLY = True
# No script reads the CSRF cookie: every form carries its token.
CSRF_COOKIE_HTTPONLY = True
# Origins (scheme://host) whose form posts are trusted, e.g. the public https URL behind a proxy.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "csp",
    "apps.common.apps.CommonConfig",
    "apps.engines",
    "apps.tenants",
    "apps.notifications",
    "apps.interactions",
    "apps.adapters",
    "apps.serving",
    "apps.training",
    "apps.cohorts",
    "apps.experiments",
    "apps.privacy",
    "apps.dashboard",
]

MIDDLEWARE = [
    "apps.common.observability.middleware.RequestObservabilityMiddleware",
    "apps.common.body.ChunkedBodyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "apps.dashboard.csp.PageCSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # After authentication: answers a locked-out login with the lockout page (axes, below).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'strop.sqlite3'}")
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "apps.common.cache.RedisCache",
            "LOCATION": REDIS_URL,
            # A hung Redis must not hang the request that touches the cache (its callers survive errors).
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
else:
    # Shared by the API and worker processes of the embedded default (a per-process cache would
    # keep the feedback debounce of one process from being cleared by the check in another).
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# Celery: Redis when configured, otherwise a filesystem broker under var/ (embedded default).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL or "filesystem://")
_transport_options = broker_transport_options(CELERY_BROKER_URL, VAR_DIR / "celery")
if _transport_options is not None:
    CELERY_BROKER_TRANSPORT_OPTIONS = _transport_options
CELERY_BROKER_CONNECTION_TIMEOUT = 1
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# Queues by workload, training pools (STROP_GPU_POOLS: a tenant's runs go to its pool's queue) and
# webhook deliveries on a queue of their own: config/celery_config.py.
STROP_GPU_POOLS: dict[str, str] = gpu_pools(os.environ.get("STROP_GPU_POOLS", ""))
CELERY_TASK_QUEUES = task_queues(STROP_GPU_POOLS)
CELERY_TASK_ROUTES = {
    "workers.serving.*": {"queue": "serving"},
    "workers.training.training_run_execute": {"queue": "gpu"},
    "workers.notifications.*": {"queue": "webhooks"},
}
# Webhooks (apps.notifications): one attempt's whole exchange (connect, TLS, request, answer) ends
# within STROP_WEBHOOK_TIMEOUT_S, reading at most STROP_WEBHOOK_MAX_RESPONSE_BYTES of the answer; a
# delivery is tried STROP_WEBHOOK_MAX_ATTEMPTS times, waiting RETRY_BASE_S x 5^n (at most RETRY_MAX_S)
# between attempts, before it is marked failed. After a secret rotation the old secret signs beside the
# new one for STROP_WEBHOOK_SECRET_OVERLAP_S. Addresses that are not public (private, loopback,
# link-local, NAT64, 6to4, Teredo, ...) are refused unless STROP_WEBHOOK_ALLOW_PRIVATE: for the test
# suite and a single machine of one's own, never where tenants are not the operator.
STROP_WEBHOOK_TIMEOUT_S = float(os.environ.get("STROP_WEBHOOK_TIMEOUT_S", "10"))
STROP_WEBHOOK_MAX_RESPONSE_BYTES = env_int("STROP_WEBHOOK_MAX_RESPONSE_BYTES", 64 * 1024)
STROP_WEBHOOK_MAX_ATTEMPTS = env_int("STROP_WEBHOOK_MAX_ATTEMPTS", 6)
STROP_WEBHOOK_RETRY_BASE_S = env_int("STROP_WEBHOOK_RETRY_BASE_S", 10)
STROP_WEBHOOK_RETRY_MAX_S = env_int("STROP_WEBHOOK_RETRY_MAX_S", 7200)
STROP_WEBHOOK_SECRET_OVERLAP_S = env_int("STROP_WEBHOOK_SECRET_OVERLAP_S", 24 * 3600)
STROP_WEBHOOK_ALLOW_PRIVATE = env_bool("STROP_WEBHOOK_ALLOW_PRIVATE", False)
# Beat must schedule once: every beat process takes a lock in Redis before it sends anything, and one
# that does not hold it waits. The lock lapses this many seconds after its holder stops renewing it.
STROP_BEAT_LOCK_TTL_S = env_int("STROP_BEAT_LOCK_TTL_S", 30)
CELERY_BEAT_SCHEDULER = "workers.beat:SingleBeatScheduler"
# GET /health/ready gives each dependency (database, Redis, adapter store, vLLM) this long to answer.
STROP_READY_TIMEOUT_S = float(os.environ.get("STROP_READY_TIMEOUT_S", "2"))
# ... and each API process answers it from its last check for this many seconds (0: check every call).
STROP_READY_CACHE_S = float(os.environ.get("STROP_READY_CACHE_S", "5"))
# Retention: the most days a tenant may keep interactions (0: no maximum); a tenant's own setting is
# bounded by it, and a tenant without one keeps this many (apps.interactions.rollups, apps.privacy.retention).
# A negative maximum would put every tenant's cutoff in the future: refused.
STROP_RETENTION_MAX_DAYS = env_int(
    "STROP_RETENTION_MAX_DAYS", 0, minimum=0, hint="give a number of days, or 0 for no maximum"
)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "rollups-refresh": {"task": "workers.ingest.rollups_refresh_all", "schedule": 5.0},
    "retention-prune": {"task": "workers.ingest.retention_prune_all", "schedule": 3600.0},
    "attach-pending-feedback": {"task": "workers.ingest.feedback_attach_pending_all", "schedule": 60.0},
    "close-stale-streams": {"task": "workers.ingest.stream_parts_sweep", "schedule": 30.0},
    "training-schedule": {"task": "workers.training.training_schedule_all", "schedule": 15.0},
    "training-reap-stale": {"task": "workers.training.training_reap_stale", "schedule": 20.0},
    "training-sweep-queued": {"task": "workers.training.training_sweep_queued", "schedule": 60.0},
    "webhook-deliveries-resend": {"task": "workers.notifications.webhook_deliveries_resend", "schedule": 60.0},
    "experiment-snapshots": {
        "task": "workers.experiments.experiment_snapshot_all",
        "schedule": float(os.environ.get("STROP_EXPERIMENT_SNAPSHOT_S", "60")),
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Dashboard (and admin) sign-in is throttled by django-axes: after AXES_FAILURE_LIMIT failures for one
# username from one address, that username is refused from that address (only), and after
# STROP_LOGIN_ADDRESS_FAILURE_LIMIT failures from one address (for any usernames), that address is
# refused for every username; each for AXES_COOLOFF_MINUTES, with the lockout page and a 429, even
# with the right password (apps.dashboard.login_throttle.PairThenAddressHandler). Failures are rows
# in the database, shared by every API process; `manage.py axes_reset_ip ADDRESS` lifts a lockout early.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "apps.dashboard.login_throttle.PairThenAddressHandler"
STROP_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("STROP_LOGIN_ADDRESS_FAILURE_LIMIT", 50)
AXES_LOCKOUT_TEMPLATE = "dashboard/auth/locked_out.html"
# Behind proxies, the client's address is the one the outermost of STROP_TRUSTED_PROXY_HOPS proxies
# appended to X-Forwarded-For; 0 (no proxy) takes the connection's address.
STROP_TRUSTED_PROXY_HOPS = env_int("STROP_TRUSTED_PROXY_HOPS", 0)
AXES_CLIENT_IP_CALLABLE = "apps.dashboard.login_throttle.client_address"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# Front-end libraries (htmx, axe-core) fetched by `make assets` with npm; never committed.
VENDOR_STATIC_DIR = Path(os.environ.get("STROP_VENDOR_STATIC_DIR", BASE_DIR / "var" / "vendor" / "static"))
VENDOR_STATIC_DIR.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [("vendor", VENDOR_STATIC_DIR)]

# The dashboard: Django's session login; tenant admins sign in at /dashboard/login/.
LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "dashboard:login"
# Password-reset mail ("Forgot your password?"), by SMTP once EMAIL_HOST is set. Without it mail is
# printed to the log by the console backend: fine on one developer's machine, refused when deployed
# (a reset link in a container's log is a password for whoever reads the logs; check_deployment below).
# An owner or admin can always hand a member a reset link from the Team page instead.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 587)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ValueError("EMAIL_USE_TLS (STARTTLS, port 587) and EMAIL_USE_SSL (port 465): set one, not both")
# A hung mail server must not hold a request thread.
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
EMAIL_BACKEND = os.environ.get(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend",
)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "Strop <strop@localhost>")
# Accounts: a reset link an owner or admin hands out (Team page) works this long; a mailed one
# PASSWORD_RESET_TIMEOUT (Django's 3 days). Both die when the account's roles or tenants change.
STROP_ADMIN_RESET_LINK_TTL_S = env_int("STROP_ADMIN_RESET_LINK_TTL_S", 3600)
# "Forgot your password?": at most this many mails per e-mail address, and requests per client
# address, per window; past either, no mail is sent and the page answers as always.
STROP_PASSWORD_RESET_MAILS_PER_ACCOUNT = env_int("STROP_PASSWORD_RESET_MAILS_PER_ACCOUNT", 3)
STROP_PASSWORD_RESET_REQUESTS_PER_CLIENT = env_int("STROP_PASSWORD_RESET_REQUESTS_PER_CLIENT", 20)
STROP_PASSWORD_RESET_WINDOW_S = env_int("STROP_PASSWORD_RESET_WINDOW_S", 3600)
# The dashboard's eval-set upload (file or pasted cases): larger is refused (413) before it is read.
STROP_EVAL_SET_MAX_BYTES = env_int("STROP_EVAL_SET_MAX_BYTES", 5 * 1024 * 1024)

# Requests larger than this are refused with 413 before they are parsed.
STROP_MAX_BODY_BYTES = env_int("STROP_MAX_BODY_BYTES", 16 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = STROP_MAX_BODY_BYTES
# Items in one batch call (interactions or feedback).
STROP_MAX_BATCH_ITEMS = env_int("STROP_MAX_BATCH_ITEMS", 1000)
# Default per-tenant request budget per minute; each tenant may override it.
STROP_DEFAULT_RATE_LIMIT_PER_MINUTE = env_int("STROP_DEFAULT_RATE_LIMIT_PER_MINUTE", 6000)
# An API process takes a tenant's budget from Redis in blocks of at most this many requests (and at
# most 1/16 of what is left in the minute), so most requests make no Redis round trip; 1 asks Redis
# on every request.
STROP_RATE_LIMIT_BLOCK = env_int("STROP_RATE_LIMIT_BLOCK", 32)
# A batch call (interactions, feedback, consent import) costs one unit of the rate limit per this many
# items, at least one: a 1,000-item batch weighs 50 single calls.
STROP_RATE_LIMIT_ITEMS_PER_UNIT = env_int("STROP_RATE_LIMIT_ITEMS_PER_UNIT", 20)
# A completion costs one unit per this many tokens it may generate (n x max_tokens as served, at least
# one unit): at the default, a completion at the adapter's default limit (256) costs one, n=8 costs 8.
STROP_RATE_LIMIT_TOKENS_PER_UNIT = env_int("STROP_RATE_LIMIT_TOKENS_PER_UNIT", 256)
# While Redis is unreachable each API process counts alone and serves a tenant at most its limit
# divided by this (at least 1 unit). 1: every process may serve the whole limit (an outage admits at
# most processes x limit); the number of API processes: a bound near the limit, if load is even.
STROP_RATE_LIMIT_PROCESSES = env_int("STROP_RATE_LIMIT_PROCESSES", 1)
# last_used_at of a key is written at most this often (seconds), to keep auth off the write path.
STROP_KEY_LAST_USED_RESOLUTION_S = env_int("STROP_KEY_LAST_USED_RESOLUTION_S", 60)

# vLLM: one or more replicas (comma-separated base URLs), and the limits it was started with.
VLLM_BASE_URLS = env_http_urls("VLLM_BASE_URLS", "http://127.0.0.1:8100")
VLLM_MAX_LORA_RANK = env_int("VLLM_MAX_LORA_RANK", 16)
VLLM_MAX_LORAS = env_int("VLLM_MAX_LORAS", 4)
VLLM_MAX_CPU_LORAS = env_int("VLLM_MAX_CPU_LORAS", 16)
VLLM_TIMEOUT_S = float(os.environ.get("VLLM_TIMEOUT_S", "30"))
# Opening a connection to a replica while another is left to try: short, so one that does not answer
# is left fast (a refused connection fails at once). The last replica to try gets 5 s to connect
# (vllm_transport.LAST_CONNECT_S; VLLM_TIMEOUT_S if shorter), and a wait for a free connection in
# the API process's pool is as long: under a burst of hundreds of new streams the process's own
# busy loop must not read as a dead replica
# (apps.engines.vllm_transport.Replicas._timeouts).
VLLM_CONNECT_TIMEOUT_S = float(os.environ.get("VLLM_CONNECT_TIMEOUT_S", "1"))
# Sent as "Authorization: Bearer" on every call to every replica; platform/vllm.sh starts vLLM with
# the same key. Required when deployed; empty only on the embedded default (a vLLM on loopback).
VLLM_API_KEY = os.environ.get("VLLM_API_KEY", "")
# With several replicas: "tenant" sends each tenant's completions to its home replica (rendezvous
# hashing; the next one only if it refuses connections), so its adapters stay in that replica's
# LoRA slots; "round_robin" spreads every request.
VLLM_ROUTING = os.environ.get("VLLM_ROUTING", "tenant")
if VLLM_ROUTING not in ("tenant", "round_robin"):
    raise ValueError(f"VLLM_ROUTING={VLLM_ROUTING!r}: choose tenant or round_robin")
# Training: run working directories, liveness, retries.
STROP_RUN_ROOT = Path(os.environ.get("STROP_RUN_ROOT", VAR_DIR / "runs"))
TRAINING_HEARTBEAT_S = float(os.environ.get("TRAINING_HEARTBEAT_S", "5"))
TRAINING_STALE_AFTER_S = env_int("TRAINING_STALE_AFTER_S", 60)
TRAINING_MAX_ATTEMPTS = env_int("TRAINING_MAX_ATTEMPTS", 3)
# Wall-time limit of one training run, export to registration (seconds). A run past it stops at its
# next step and ends failed, freeing the gpu worker; Celery's soft and hard time limits on the gpu
# task (this plus TRAINING_STALE_AFTER_S, and plus twice that) back it up. A 512-event SmolLM2 round
# takes 5-30 minutes on 2 CPU cores.
TRAINING_MAX_RUN_S = env_int("TRAINING_MAX_RUN_S", 3600)
# The most labelled events one run's window takes (the oldest first; the rest wait for the next run).
TRAINING_MAX_WINDOW_EVENTS = env_int("TRAINING_MAX_WINDOW_EVENTS", 2048)
# CPU threads for training when there is no GPU. vLLM's CPU build binds its busy-waiting OpenMP
# workers to every core but one; a trainer that also spreads over them runs ~7x slower (measured
# here: 27 s vs 3.8 s for one run). The default takes the one core vLLM leaves free.
TRAINER_CPU_THREADS = env_int("TRAINER_CPU_THREADS", 1)
# Forward passes of training under bf16 autocast (PPOConfig.autocast_bf16), unless a tenant's
# trainer overrides say otherwise: 1 / 0, or "auto" (where bf16 is native: a GPU, or a CPU with AMX
# or AVX-512 bf16). ~1.65x on a CPU with AMX, ~2.3x (SmolLM2) with AVX-512 bf16 alone; about 10x
# slower on one with neither.
TRAINER_AUTOCAST_BF16 = os.environ.get("TRAINER_AUTOCAST_BF16", "0")
# Starting an experiment checks that vLLM serves the candidate's weights: the largest difference
# allowed between vLLM's and the trainer's log-prob of a probe token (nats). fp32 on CPU agrees to
# about 1e-4; bf16 on a GPU to a few hundredths.
STROP_PROBE_TOLERANCE = float(os.environ.get("STROP_PROBE_TOLERANCE", "0.05"))
# Adapter versions live here, one directory each, never overwritten.
STROP_ADAPTER_ROOT = Path(os.environ.get("STROP_ADAPTER_ROOT", VAR_DIR / "adapters"))
# The adapter store: empty = the local filesystem under STROP_ADAPTER_ROOT (the embedded default);
# s3://bucket/prefix = S3-compatible object storage, reached with the standard AWS settings below
# (AWS_ENDPOINT_URL for a store that is not AWS itself). The trainer writes a version once; vLLM
# replicas fetch it themselves (platform/vllm_plugins/strop_vllm_store.py).
STROP_ADAPTER_STORE = os.environ.get("STROP_ADAPTER_STORE", "")
if STROP_ADAPTER_STORE and not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?", STROP_ADAPTER_STORE):
    raise ValueError(f"STROP_ADAPTER_STORE={STROP_ADAPTER_STORE!r}: leave it empty or give s3://bucket/prefix")
AWS_ENDPOINT_URL = os.environ.get("AWS_ENDPOINT_URL", "")
AWS_ACCESS_KEY_ID = os.environ.get("AWS_ACCESS_KEY_ID", "")
AWS_SECRET_ACCESS_KEY = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
AWS_DEFAULT_REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
# The purge of versions that learned from an erased user deletes objects: with a key of its own, in the
# API only, the keys that read (vLLM, the API) and write (the trainer) the store never need to delete.
# Unset: the purge uses the AWS_* credentials above.
STROP_STORE_PURGE_KEY_ID = os.environ.get("STROP_STORE_PURGE_KEY_ID", "")
STROP_STORE_PURGE_SECRET = os.environ.get("STROP_STORE_PURGE_SECRET", "")


# Logs: LOG_FORMAT, LOG_QUIET, LOG_FILE and LOG_LEVEL (config/log_config.py says what each does).
LOG_FORMAT, LOG_QUIET, LOG_FILE = log_format(), env_bool("LOG_QUIET", False), os.environ.get("LOG_FILE", "")
LOGGING = logging_config(
    log_format=LOG_FORMAT, quiet=LOG_QUIET, log_file=LOG_FILE, level=os.environ.get("LOG_LEVEL", "INFO")
)

# Prometheus: every process (gunicorn workers, Celery) counts into its own files in this folder and
# GET /metrics adds them all up. Exported before anything loads prometheus_client, which reads it at
# import. Empty it only when no Strop process runs (platform/up.sh does, before starting them all).
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "prometheus"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
# GET /metrics: with a token, callers send "Authorization: Bearer <token>"; without, loopback only.
STROP_METRICS_TOKEN = os.environ.get("STROP_METRICS_TOKEN", "")

# Last, once every setting is read: refuse to start with a weak or missing secret, or a deployment
# that would print password-reset mail to its log (config/secret_keys.py, its table SECRETS).
check_deployment(globals(), deployed=STROP_DEPLOYED, debug=DEBUG, root=BASE_DIR)

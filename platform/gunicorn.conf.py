# Gunicorn settings for Strop's API: `gunicorn -c platform/gunicorn.conf.py config.asgi -k
# config.uvicorn_worker.StropUvicornWorker` (the Procfile keeps bind, workers and the worker class on its command
# line). Each worker is one uvicorn process: an event loop for the serving endpoints' streams and a few
# threads for the synchronous rest (config/asgi.py). config.wsgi with gthread still runs, without the
# asynchronous serving path (a stream then holds its thread).
import importlib
import os

# The settings export PROMETHEUS_MULTIPROC_DIR (default var/prometheus). Loading them here, in the
# master, gives child_exit below the same folder as the workers it forks. (Not `import config...`:
# gunicorn reads every top-level name of this file as a setting, and `config` is one.)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
importlib.import_module("config.settings")

# An idle keep-alive connection stays open longer than clients keep theirs (httpx and the openai
# client: 5 s), so the client is the one that closes it. With
# gunicorn's default of 2 s a client polling every 2 s sends its request on a connection the
# server is closing at that moment and gets "server disconnected" for a request never read.
keepalive = 75
# On SIGTERM (a deploy, a restart) a worker stops taking connections and lets its streams finish, for at
# most this long, so what it was serving is served and recorded; past it the master kills it. The worker
# (config/uvicorn_worker.py) cancels streams still open a few seconds before that, so each records what
# it served before the kill. STROP_API_GRACEFUL_TIMEOUT_S sets it (the tests use a short one).
graceful_timeout = int(os.environ.get("STROP_API_GRACEFUL_TIMEOUT_S", "30"))


def child_exit(server, worker):
    """A worker is gone (exit, crash or timeout): prometheus_client's bookkeeping for its pid.
    Its counters stay in the totals; only per-process live gauges are dropped."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)

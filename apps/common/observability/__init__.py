"""What operators see: Prometheus metrics and structured logs with a request id.

- ``context``: the request id, tenant and task of the work in progress (contextvars);
- ``logs``: the JSON (or plain) log formatter that writes them on every line;
- ``middleware``: gives each request its id, counts and times it by route and tenant;
- ``celery_signals``: carries the id into the tasks a request enqueues, counts task outcomes;
- ``metrics``: the counters and histograms, shared by every process (multiprocess mode);
- ``collectors``: values read at scrape time from the database, the broker and vLLM;
- ``views``: ``GET /metrics``, for operators only.

This package imports nothing at import time that needs Django set up, and only ``metrics``
(and what imports it) loads prometheus_client: it must load after the settings have exported
``PROMETHEUS_MULTIPROC_DIR``, or every process would count on its own.
"""

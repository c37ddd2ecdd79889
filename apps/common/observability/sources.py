"""What the apps add to /metrics, registered when they load.

``common`` knows no domain app: each app names its readers here in its ``AppConfig.ready``, by
dotted path, so that registering imports nothing (prometheus_client must not load before the
process chose its multiprocess directory); the collector imports them at the first scrape.
"""

from __future__ import annotations

# (source, dotted path of a reader) in registration order. A reader yields metric families; the
# source names it in ``strop_scrape_source_up`` (readers that share a source are up together),
# None: read on its own, expected not to fail.
registered: list[tuple[str | None, str]] = []


def scrape_source_register(source: str | None, reader: str) -> None:
    if (source, reader) not in registered:
        registered.append((source, reader))

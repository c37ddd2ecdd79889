from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "apps.engines"
    label = "engines"

    def ready(self) -> None:
        from apps.common.observability.sources import scrape_source_register

        scrape_source_register(None, "apps.engines.gauges.vllm_replicas_metrics")

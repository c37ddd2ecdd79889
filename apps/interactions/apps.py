from django.apps import AppConfig


class InteractionsConfig(AppConfig):
    name = "apps.interactions"
    label = "interactions"

    def ready(self) -> None:
        from apps.common.observability.sources import scrape_source_register

        scrape_source_register("database", "apps.interactions.gauges.feedback_pending_metrics")

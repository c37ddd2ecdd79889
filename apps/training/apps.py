from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "apps.training"
    label = "training"

    def ready(self) -> None:
        from apps.common.observability.sources import scrape_source_register

        scrape_source_register("database", "apps.training.metrics.training_runs_metrics")

from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "apps.training"
    label = "training"

    def ready(self) -> None:
        from apps.common.observability.sources import scrape_source_register
        from apps.interactions.rewards import reward_table_source_register
        from apps.training.selectors import training_policy_reward_table

        scrape_source_register("database", "apps.training.gauges.training_runs_metrics")
        reward_table_source_register(training_policy_reward_table)

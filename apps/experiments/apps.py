from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "apps.experiments"
    label = "experiments"

    def ready(self) -> None:
        # Logged interactions of an exposed end user are tagged with their arm at ingest.
        from apps.experiments.selectors import experiment_arms_of_logged
        from apps.interactions.arms import arm_lookup_register

        arm_lookup_register(experiment_arms_of_logged)

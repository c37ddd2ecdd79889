from django.apps import AppConfig


class CohortsConfig(AppConfig):
    name = "apps.cohorts"
    label = "cohorts"

from django.apps import AppConfig


class InteractionsConfig(AppConfig):
    name = "apps.interactions"
    label = "interactions"

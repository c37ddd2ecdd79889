from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "apps.serving"
    label = "serving"

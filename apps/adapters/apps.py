from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "apps.adapters"
    label = "adapters"

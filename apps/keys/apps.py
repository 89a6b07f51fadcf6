from django.apps import AppConfig


class KeysConfig(AppConfig):
    name = "apps.keys"
    verbose_name = "Keys, tenants and usage"

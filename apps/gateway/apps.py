from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "apps.gateway"
    verbose_name = "Gateway"

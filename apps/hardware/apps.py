from django.apps import AppConfig


class HardwareConfig(AppConfig):
    name = "apps.hardware"
    verbose_name = "Hardware and nodes"

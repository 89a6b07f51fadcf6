from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operator console's own pages inside the admin: the fleet dashboard and the request
    trace. It owns no models; it reads what the other apps record, through their selectors."""

    name = "apps.console"
    verbose_name = "Operator console"

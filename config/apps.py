from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class PlatformConfig(AppConfig):
    """The composition root as an installed app: its management commands (dmx_demo)."""

    name = "config"
    verbose_name = "Platform"


class PlatformAdminConfig(AdminConfig):
    """django.contrib.admin with the platform's site. Declared here, not beside the site,
    because Django imports an app's config before the models exist and the site's pages import
    the apps."""

    default_site = "config.admin.PlatformAdminSite"

"""The console's two roles, as groups: `operator` may change everything of the platform's apps
(and run their actions), `viewer` may look at all of it and change nothing. Operators put staff
users in one of them; superusers stay above both. tests/keys/test_staff_roles.py fails when a
model is added without its permissions here."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

PLATFORM_APPS = ("keys", "models", "hardware", "routing", "gateway")
ROLES = {"operator": ("add", "change", "delete", "view"), "viewer": ("view",)}


def _create_roles(apps, schema_editor):
    # Permissions are made after all migrations ran; this one needs them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ours = Permission.objects.filter(content_type__app_label__in=PLATFORM_APPS)
    for name, actions in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set([p for p in ours if p.codename.split("_", 1)[0] in actions])


def _drop_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("keys", "0004_tenancy_accounts_rotation"),
        ("models", "0002_sla_and_canary"),
        ("hardware", "0004_node_drained"),
        ("routing", "0002_admin_proxies"),
        ("gateway", "0001_initial"),
    ]

    operations = [migrations.RunPython(_create_roles, _drop_roles)]

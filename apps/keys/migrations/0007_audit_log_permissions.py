"""Both console roles may read the audit log (auditlog's LogEntry) and nothing more: entries are
evidence, so no group gets add, change or delete on them (the admin refuses those to superusers
too, see dmxplatform/audit.py)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

ROLES = ("operator", "viewer")


def _grant_view(apps, schema_editor):
    # Permissions are made after all migrations ran; this one needs auditlog's now.
    app_config = apps.get_app_config("auditlog")
    app_config.models_module = True
    create_permissions(app_config, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = Permission.objects.get(content_type__app_label="auditlog", codename="view_logentry")
    for name in ROLES:
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(view)


def _revoke_view(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = Permission.objects.filter(content_type__app_label="auditlog", codename="view_logentry")
    for group in Group.objects.filter(name__in=ROLES):
        group.permissions.remove(*view)


class Migration(migrations.Migration):
    dependencies = [
        ("keys", "0006_usage_client_request_id_trace_id"),
        ("auditlog", "0017_add_actor_email"),
    ]

    operations = [migrations.RunPython(_grant_view, _revoke_view)]

"""The console's roles on billing's models, as keys/0005 gave them on the other apps': the
`operator` group adds, changes, deletes and views (and so runs the top-ups, sets prices and
generates codes), the `viewer` group only views."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

ROLES = {"operator": ("add", "change", "delete", "view"), "viewer": ("view",)}


def grant_roles(apps, schema_editor=None, *, app_label="billing"):
    """Give the groups the app's permissions (made here: Django makes them after migrating);
    apps added later grant theirs with it too (batches/0002)."""
    app_config = apps.get_app_config(app_label)
    app_config.models_module = True
    create_permissions(app_config, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ours = list(Permission.objects.filter(content_type__app_label=app_label))
    for name, actions in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*(p for p in ours if p.codename.split("_", 1)[0] in actions))


def revoke_roles(apps, schema_editor, *, app_label="billing"):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ours = Permission.objects.filter(content_type__app_label=app_label)
    for group in Group.objects.filter(name__in=ROLES):
        group.permissions.remove(*ours)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0002_existing_versions_free"),
        ("keys", "0005_operator_and_viewer_groups"),
    ]

    operations = [migrations.RunPython(grant_roles, revoke_roles)]

"""The console's roles on batches' models, as billing/0003 gives them on billing's: the
`operator` group sees and cancels batches, the `viewer` group only sees them."""

import functools
import importlib

from django.db import migrations

_roles = importlib.import_module("apps.billing.migrations.0003_console_roles")


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0001_initial"),
        ("billing", "0003_console_roles"),
    ]

    operations = [
        migrations.RunPython(
            functools.partial(_roles.grant_roles, app_label="batches"),
            functools.partial(_roles.revoke_roles, app_label="batches"),
        )
    ]

"""Model versions that served before prices existed go on serving, marked free from the epoch:
an operator prices them (from some moment on) when billing starts. Versions added later have no
price until an operator sets one, and are refused until then."""

from datetime import UTC, datetime

from django.db import migrations

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def mark_free(apps, schema_editor):
    ModelVersion = apps.get_model("models", "ModelVersion")
    Price = apps.get_model("billing", "Price")
    Price.objects.bulk_create(
        Price(
            model_version_id=version_id,
            input_per_million=0,
            cached_input_per_million=0,
            output_per_million=0,
            effective_from=EPOCH,
            created_by="migration",
        )
        for version_id in ModelVersion.objects.values_list("id", flat=True)
    )


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(mark_free, migrations.RunPython.noop)]

"""The intent's confidence on the usage record (issue 19); nullable and defaulted, so adding the
columns rewrites no existing row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("keys", "0007_audit_log_permissions"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="intent_confidence",
            field=models.FloatField(
                blank=True,
                help_text="The classifier's calibrated probability for the intent.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="usagerecord",
            name="intent_low_confidence",
            field=models.BooleanField(
                default=False,
                help_text="The confidence was under DMX_INTENT_MIN_CONFIDENCE: an alias routed it by its default route.",
            ),
        ),
    ]

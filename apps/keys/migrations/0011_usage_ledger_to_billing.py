"""The usage ledger (UsageRecord, UsageDaily) moves to billing: keys forgets the two models, the
tables stay where they are (billing.0005 takes them over under their old names)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("keys", "0010_billing_fields"),
        ("billing", "0004_amount_limits"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="UsageRecord"),
                migrations.DeleteModel(name="UsageDaily"),
            ],
        ),
    ]

"""A routing rule's priority tier (issue 34); nullable, so adding the column rewrites no row and
every existing rule keeps its requests at their key's tier."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('routing', '0004_intent_confidence'),
    ]

    operations = [
        migrations.AddField(
            model_name='routingrule',
            name='tier',
            field=models.PositiveSmallIntegerField(blank=True, choices=[(0, 'Batch'), (1, 'Standard'), (2, 'Priority')], help_text="Empty: the key's tier. Else the requests this rule routes run at the lower of this tier and their key's (e.g. summarization at Batch).", null=True),
        ),
    ]

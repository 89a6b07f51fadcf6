import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('models', '0002_sla_and_canary'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelversion',
            name='canary_steps',
            field=models.JSONField(blank=True, default=list, help_text='The ramp: the percentages the canary takes step by step, e.g. [5, 25, 50, 100].'),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='canary_step',
            field=models.PositiveSmallIntegerField(default=0, help_text="The ramp's current step, counted from 0."),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='canary_step_started_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='canary_min_requests',
            field=models.PositiveIntegerField(blank=True, help_text='Gate: requests a step serves before it is judged.', null=True, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='canary_error_tolerance',
            field=models.FloatField(blank=True, help_text="Gate: how far the canary's error rate may exceed the stable versions', 0-1.", null=True, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(1)]),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='canary_latency_p95_ms',
            field=models.PositiveIntegerField(blank=True, help_text="Gate: the P95 latency bound, ms; empty: the stable versions' P95 plus a tenth.", null=True, validators=[django.core.validators.MinValueValidator(1)]),
        ),
    ]

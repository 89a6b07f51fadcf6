"""The usage ledger moves here from keys (keys.0011 forgets it): the same tables under their old
names, so no row moves and nothing is locked; only Django's state changes, and the content types
(and with them every group's and user's permissions on the two models) are relabelled."""

import django.db.models.deletion
from django.db import migrations, models

MODELS = ("usagerecord", "usagedaily")


def _relabel(apps, old: str, new: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    moving = ContentType.objects.filter(app_label=old, model__in=MODELS)
    if not moving.exists():
        # A database migrated from scratch by this code: the roles' migrations made the
        # permissions under the new label already (create_permissions reads today's models).
        return
    # Types the new label got since (a partial migrate's post_migrate) have no grants to keep.
    ContentType.objects.filter(app_label=new, model__in=MODELS).delete()
    moving.update(app_label=new)


def to_billing(apps, schema_editor):
    _relabel(apps, "keys", "billing")


def to_keys(apps, schema_editor):
    _relabel(apps, "billing", "keys")


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0004_amount_limits'),
        ('keys', '0011_usage_ledger_to_billing'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.RunPython(to_billing, to_keys),
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='UsageDaily',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('day', models.DateField()),
                    ('model', models.CharField(max_length=128)),
                    ('requests', models.PositiveIntegerField(default=0)),
                    ('errors', models.PositiveIntegerField(default=0)),
                    ('prompt_tokens', models.PositiveBigIntegerField(default=0)),
                    ('cached_tokens', models.PositiveBigIntegerField(default=0)),
                    ('completion_tokens', models.PositiveBigIntegerField(default=0)),
                    ('cost', models.DecimalField(decimal_places=6, default=0, max_digits=20)),
                    ('api_key', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_days', to='keys.apikey')),
                    ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_days', to='keys.tenant')),
                ],
                options={
                    'verbose_name_plural': 'usage by day',
                    'db_table': 'keys_usagedaily',
                    'ordering': ['-day', 'model'],
                    'indexes': [models.Index(fields=['tenant', 'day'], name='usage_daily_tenant_day_idx')],
                    'constraints': [models.UniqueConstraint(fields=('day', 'api_key', 'model'), name='usage_daily_unique')],
                },
            ),
            migrations.CreateModel(
                name='UsageRecord',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('request_id', models.CharField(max_length=64, unique=True)),
                    ('created_at', models.DateTimeField(help_text='When the gateway received the request.')),
                    ('endpoint', models.CharField(max_length=32)),
                    ('model', models.CharField(max_length=128)),
                    ('model_version', models.CharField(blank=True, max_length=64)),
                    ('node', models.CharField(blank=True, max_length=128)),
                    ('intent', models.CharField(blank=True, max_length=32)),
                    ('intent_confidence', models.FloatField(blank=True, help_text="The classifier's calibrated probability for the intent.", null=True)),
                    ('intent_low_confidence', models.BooleanField(default=False, help_text='The confidence was under DMX_INTENT_MIN_CONFIDENCE: an alias routed it by its default route.')),
                    ('stream', models.BooleanField(default=False)),
                    ('status', models.CharField(choices=[('ok', 'Completed'), ('client_disconnected', 'Client disconnected'), ('upstream_error', 'Upstream error'), ('rejected', 'Rejected'), ('content_filtered', 'Stopped by the content filter'), ('timed_out', 'Ran past the request timeout'), ('interrupted', "Cut off by the gateway's shutdown")], max_length=32)),
                    ('http_status', models.PositiveSmallIntegerField()),
                    ('error_code', models.CharField(blank=True, max_length=64)),
                    ('prompt_tokens', models.PositiveIntegerField(default=0)),
                    ('cached_tokens', models.PositiveIntegerField(default=0, help_text='Prompt tokens the engine served from its prefix cache.')),
                    ('completion_tokens', models.PositiveIntegerField(default=0)),
                    ('cost', models.DecimalField(decimal_places=6, default=0, help_text='In DMX_CURRENCY, at the prices in force when the request arrived.', max_digits=20)),
                    ('duration_ms', models.FloatField(default=0.0)),
                    ('time_to_first_token_ms', models.FloatField(blank=True, null=True)),
                    ('estimated_prompt_tokens', models.PositiveIntegerField(blank=True, null=True)),
                    ('context_limit', models.PositiveIntegerField(blank=True, help_text='Context tokens allowed when the request came in.', null=True)),
                    ('content_flags', models.JSONField(blank=True, default=list)),
                    ('timings', models.JSONField(blank=True, default=dict, help_text='Gateway stage timings, ms.')),
                    ('client_request_id', models.CharField(blank=True, help_text="The client's own id for it (X-Client-Request-Id).", max_length=128)),
                    ('trace_id', models.CharField(blank=True, help_text='Its OpenTelemetry trace, when tracing is on.', max_length=32)),
                    ('api_key', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_records', to='keys.apikey')),
                    ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_records', to='keys.tenant')),
                ],
                options={
                    'db_table': 'keys_usagerecord',
                    'ordering': ['-created_at'],
                    'indexes': [models.Index(fields=['api_key', 'created_at'], name='usage_key_time_idx'), models.Index(fields=['created_at'], name='usage_time_idx'), models.Index(condition=models.Q(('client_request_id', ''), _negated=True), fields=['client_request_id'], name='usage_client_request_idx')],
                },
            ),
        ]),
    ]

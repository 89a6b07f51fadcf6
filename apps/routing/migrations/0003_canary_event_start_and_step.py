from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('routing', '0002_admin_proxies'),
    ]

    operations = [
        migrations.AlterField(
            model_name='canaryevent',
            name='action',
            field=models.CharField(choices=[('start', 'Started'), ('step', 'Advanced a step'), ('promote', 'Promoted'), ('rollback', 'Rolled back')], max_length=16),
        ),
    ]

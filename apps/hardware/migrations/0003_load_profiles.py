from django.db import migrations


def load_profiles(apps, schema_editor):
    """Give a fresh database the hardware profiles the worker matches GPUs against."""
    from apps.hardware.profiles import profiles_sync
    from inference.hardware.profiles import load_profiles as read_files

    profiles_sync(model=apps.get_model("hardware", "HardwareProfile"), profiles=read_files())


class Migration(migrations.Migration):

    dependencies = [
        ("hardware", "0002_profile_datasheet"),
    ]

    operations = [
        migrations.RunPython(load_profiles, migrations.RunPython.noop),
    ]

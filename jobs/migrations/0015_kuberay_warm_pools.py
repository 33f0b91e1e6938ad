from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0014_warm_pools"),
    ]

    operations = [
        migrations.AddField(
            model_name="warmpool",
            name="kind",
            field=models.CharField(db_default="local", default="local", max_length=16),
        ),
        migrations.AddField(
            model_name="warmpool",
            name="namespace",
            field=models.CharField(blank=True, db_default="", default="", max_length=63),
        ),
        migrations.AddField(
            model_name="warmpool",
            name="gpu_flavor",
            field=models.CharField(blank=True, db_default="", default="", max_length=32),
        ),
    ]

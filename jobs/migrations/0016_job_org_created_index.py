# An index for jobs.prediction's read of an organisation's recent submissions (newest first).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0015_kuberay_warm_pools"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["organization", "-created_at"], name="job_org_created_idx"),
        ),
    ]

# An index for jobs.prediction's read of an organisation's recent submissions (newest first),
# built CONCURRENTLY: the jobs table is the largest, and submissions go on while it builds.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("jobs", "0015_kuberay_warm_pools"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["organization", "-created_at"], name="job_org_created_idx"),
        ),
    ]

# The three indexes whose columns lead a composite index of the table go: job_ws_state_idx and
# the foreign keys' own indexes on organization and workspace.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0016_job_org_created_index'),
        ('workspaces', '0008_org_preemption_settings'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='job',
            name='job_ws_state_idx',
        ),
        migrations.AlterField(
            model_name='job',
            name='organization',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='workspaces.organization'),
        ),
        migrations.AlterField(
            model_name='job',
            name='workspace',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='workspaces.workspace'),
        ),
    ]

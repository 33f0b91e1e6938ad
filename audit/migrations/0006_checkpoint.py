"""Signed checkpoints of the audit chains (audit/signing.py), append-only on PostgreSQL like
the events: the trigger function of migration 0003 guards them too."""

from django.db import migrations, models

FORWARD = """
CREATE TRIGGER audit_checkpoint_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION audit_event_refuse_change();

CREATE TRIGGER audit_checkpoint_no_truncate
    BEFORE TRUNCATE ON audit_auditcheckpoint
    FOR EACH STATEMENT EXECUTE FUNCTION audit_event_refuse_change();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS audit_checkpoint_no_truncate ON audit_auditcheckpoint;
DROP TRIGGER IF EXISTS audit_checkpoint_no_update_delete ON audit_auditcheckpoint;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0005_audit_append'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditCheckpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('chain', models.CharField(max_length=40)),
                ('count', models.BigIntegerField()),
                ('last_event_id', models.BigIntegerField()),
                ('head_hash', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField()),
                ('signature', models.CharField(max_length=64)),
            ],
            options={
                'ordering': ['chain', 'count'],
                'constraints': [models.UniqueConstraint(fields=('chain', 'count'), name='uniq_audit_checkpoint')],
            },
        ),
        migrations.RunPython(forward, backward),
    ]

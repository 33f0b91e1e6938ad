# DomainEvent moved to the outbox app (below the apps that write it). Only Django's state
# changes: the table and its constraints stay as they are. The content type follows the model,
# so permissions granted on it keep pointing at it.

import django.db.models.deletion
from django.db import migrations, models


def _move_content_type(apps, schema_editor, source, target):
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    old = types.filter(app_label=source, model="domainevent")
    if types.filter(app_label=target, model="domainevent").exists():
        old.delete()  # a later post_migrate already made the target's (migrated back and forth)
    else:
        old.update(app_label=target)


def content_type_to_outbox(apps, schema_editor):
    _move_content_type(apps, schema_editor, "notifications", "outbox")


def content_type_to_notifications(apps, schema_editor):
    _move_content_type(apps, schema_editor, "outbox", "notifications")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("notifications", "0002_webhooks"),
        ("outbox", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="webhookdelivery",
                    name="event",
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="outbox.domainevent"),
                ),
                migrations.DeleteModel(name="DomainEvent"),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_type_to_outbox, content_type_to_notifications),
    ]

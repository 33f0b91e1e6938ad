# DomainEvent moved here from notifications: the table (notifications_domainevent) already
# exists, so this only tells Django's state that the model is the outbox's now.

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("workspaces", "0001_initial"),
        ("notifications", "0001_initial"),  # created the table
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DomainEvent",
                    fields=[
                        ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ("type", models.CharField(max_length=64)),
                        ("occurred_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("payload", models.JSONField(default=dict)),
                        ("dispatched_at", models.DateTimeField(blank=True, null=True)),
                        ("organization", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="workspaces.organization")),
                        ("workspace", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="workspaces.workspace")),
                    ],
                    options={
                        "db_table": "notifications_domainevent",
                        "ordering": ["occurred_at", "id"],
                        "indexes": [models.Index(condition=models.Q(("dispatched_at__isnull", True)), fields=["occurred_at"], name="event_undispatched_idx")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

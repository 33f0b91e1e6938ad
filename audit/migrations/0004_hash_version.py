"""Each audit event names the canonical form its hash was computed over (audit/chain.py).

Existing rows get the database default 1, the form they were hashed with, so nothing is
re-anchored and every old event verifies as before. Adding a column with a constant default
neither rewrites the table nor fires the append-only trigger of 0003 (row triggers never run for
ALTER TABLE); tests/audit/test_migrations.py checks it on a table that holds events.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="hash_version",
            field=models.PositiveSmallIntegerField(db_default=1, default=2),
        ),
    ]

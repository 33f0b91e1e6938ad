"""The PostgreSQL trigger really refuses UPDATE, DELETE and TRUNCATE (kept in its own module: it
needs a committed database, unlike the savepoint-per-test modules)."""

import psycopg
import pytest
from django.db import connection

from audit.models import AuditEvent
from tests.conftest import SYSTEM
from workspaces import services


def raw_connection():
    """A plain connection to the test database, without the maintenance setting the test runner
    turns on for its own connections."""
    params = connection.get_connection_params()
    params.pop("options", None)
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditevent SET action = 'org.hacked'",
        "DELETE FROM audit_auditevent",
        "TRUNCATE audit_auditevent CASCADE",
    ],
)
def test_trigger_refuses_update_delete_truncate(statement):
    services.org_create(actor=SYSTEM, slug="acme", name="Acme", owner_email="o@acme.test")
    count = AuditEvent.objects.count()
    assert count > 0
    with raw_connection() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute(statement)
        assert conn.execute("SELECT count(*) FROM audit_auditevent").fetchone()[0] == count

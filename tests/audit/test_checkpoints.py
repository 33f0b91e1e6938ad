"""Signed checkpoints: verify checks every one against the chain, ``--since-checkpoint``
recomputes only what follows the latest, and an edit made before or after one is named."""

import json

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit import services as audit
from audit import tasks
from audit.chain import event_hash, org_chain, verify_chain
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent
from audit.signing import signature_holds
from tests.conftest import SYSTEM


def _append(world, count, start=0):
    for n in range(start, start + count):
        audit.record(
            actor=SYSTEM,
            action="workspace.update",
            target=world.ws,
            workspace=world.ws,
            changes={"name": [f"ML {n}", f"ML {n + 1}"]},
        )


def _sql(sql, params):
    with connection.cursor() as cursor:  # the test runner's connection may (see tests/settings)
        cursor.execute(sql, params)


def _events(chain):
    return list(AuditEvent.objects.filter(chain=chain).order_by("seq"))


@pytest.fixture
def chain(world):
    _append(world, 5)
    return org_chain(world.org.pk)


def test_a_checkpoint_signs_the_head_once(world, chain):
    first = audit.checkpoint_create(chain=chain)
    head = AuditChainHead.objects.get(chain=chain)
    last = AuditEvent.objects.get(chain=chain, seq=head.seq)
    assert (first.count, first.last_event_id, first.head_hash) == (head.seq, last.pk, head.hash)
    assert signature_holds(AuditCheckpoint.objects.get(pk=first.pk))
    assert audit.checkpoint_create(chain=chain) is None  # the head has not moved
    _append(world, 2, start=10)
    second = audit.checkpoint_create(chain=chain)
    assert second.count == first.count + 2
    result = verify_chain(chain)
    assert result.ok and result.checkpoints == 2


def test_the_signature_covers_every_field_and_needs_the_key(world, chain, settings):
    checkpoint = audit.checkpoint_create(chain=chain)
    checkpoint.count -= 1
    assert not signature_holds(checkpoint)
    checkpoint.refresh_from_db()
    settings.MANTA_AUDIT_CHECKPOINT_KEY = "another key"
    assert not signature_holds(checkpoint)
    result = verify_chain(chain)
    assert not result.ok and "signature" in result.first_broken["reason"]


def test_the_default_key_is_derived_from_the_secret_key(world, chain, settings):
    checkpoint = audit.checkpoint_create(chain=chain)
    assert settings.MANTA_AUDIT_CHECKPOINT_KEY == ""
    settings.SECRET_KEY = "rotated"
    assert not signature_holds(checkpoint)


def test_an_edit_before_the_checkpoint_is_caught_by_a_full_verify(world, chain):
    audit.checkpoint_create(chain=chain)
    _append(world, 3, start=10)
    victim = _events(chain)[2]
    _sql(
        "UPDATE audit_auditevent SET changes = %s WHERE id = %s",
        ['{"name": ["x", "y"]}', victim.pk],
    )
    result = verify_chain(chain)
    assert not result.ok and result.first_broken["id"] == victim.pk
    assert "content" in result.first_broken["reason"]
    # The incremental run does not recompute what the checkpoint vouches for.
    assert verify_chain(chain, since_checkpoint=True).ok


def test_a_rewritten_chain_no_longer_matches_its_checkpoint(world, chain):
    """Whoever rewrites an event and recomputes every hash after it, head included, leaves a
    chain that recomputes cleanly; the checkpoint signed before keeps the old head."""
    checkpoint = audit.checkpoint_create(chain=chain)
    _append(world, 3, start=10)
    events = _events(chain)
    victim = events[2]
    victim.changes = {"name": ["x", "y"]}
    prev_hash = victim.prev_hash
    for event in events[2:]:
        event.prev_hash, event.hash = prev_hash, event_hash(prev_hash, event)
        prev_hash = event.hash
        _sql(
            "UPDATE audit_auditevent SET changes = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [json.dumps(event.changes), event.prev_hash, event.hash, event.pk],
        )  # fmt: skip
    _sql("UPDATE audit_auditchainhead SET hash = %s WHERE chain = %s", [prev_hash, chain])

    for since_checkpoint in (False, True):
        result = verify_chain(chain, since_checkpoint=since_checkpoint)
        assert not result.ok
        assert result.first_broken["seq"] == checkpoint.count
        assert f"checkpoint #{checkpoint.pk}" in result.first_broken["reason"]
    with pytest.raises(CommandError):
        call_command("audit_verify", org=world.org.slug, since_checkpoint=True)


def test_an_edit_after_the_checkpoint_is_caught_by_an_incremental_verify(world, chain, capsys):
    checkpoint = audit.checkpoint_create(chain=chain)
    _append(world, 4, start=10)
    result = verify_chain(chain, since_checkpoint=True)
    assert result.ok and result.since_seq == checkpoint.count and result.checked == 4
    victim = _events(chain)[checkpoint.count + 1]
    _sql("UPDATE audit_auditevent SET actor_label = 'someone' WHERE id = %s", [victim.pk])
    result = verify_chain(chain, since_checkpoint=True)
    assert not result.ok and result.first_broken["id"] == victim.pk
    assert "content" in result.first_broken["reason"]
    with pytest.raises(CommandError):
        call_command("audit_verify", org=world.org.slug, since_checkpoint=True)
    assert "BROKEN" in capsys.readouterr().out


def test_events_cut_from_the_end_are_caught_by_the_checkpoint(world, chain):
    checkpoint = audit.checkpoint_create(chain=chain)
    kept = checkpoint.count - 2
    _sql("DELETE FROM audit_auditevent WHERE chain = %s AND seq > %s", [chain, kept])
    last = AuditEvent.objects.get(chain=chain, seq=kept)
    _sql("UPDATE audit_auditchainhead SET seq = %s, hash = %s WHERE chain = %s",
         [kept, last.hash, chain])  # fmt: skip
    result = verify_chain(chain)
    assert not result.ok and f"signed seq {checkpoint.count}" in result.first_broken["reason"]
    assert not verify_chain(chain, since_checkpoint=True).ok


def test_a_chain_that_does_not_verify_is_not_signed(world, chain):
    victim = _events(chain)[1]
    _sql("UPDATE audit_auditevent SET action = 'org.hacked' WHERE id = %s", [victim.pk])
    with pytest.raises(audit.AuditChainBroken):
        audit.checkpoint_create(chain=chain)
    assert not AuditCheckpoint.objects.filter(chain=chain).exists()
    written, broken = audit.checkpoint_chains()
    assert chain in [result.chain for result in broken]
    assert chain not in [checkpoint.chain for checkpoint in written]


def test_the_periodic_task_signs_the_chains_that_moved(world, chain):
    assert tasks.checkpoint() == AuditChainHead.objects.count()
    assert tasks.checkpoint() == 0  # run twice: nothing new
    _append(world, 1, start=20)
    assert tasks.checkpoint() == 1
    schedule = settings.CELERY_BEAT_SCHEDULE["audit-checkpoint"]
    assert schedule == {"task": "manta.audit.checkpoint", "schedule": 3600.0}


def test_the_commands(world, chain, capsys):
    call_command("audit_checkpoint", org=world.org.slug)
    assert f"{chain}: checkpoint at seq" in capsys.readouterr().out
    call_command("audit_checkpoint", org=world.org.slug)
    assert "unchanged" in capsys.readouterr().out
    _append(world, 2, start=30)
    call_command("audit_verify", org=world.org.slug, since_checkpoint=True)
    out = capsys.readouterr().out
    assert "ok (2 events after the checkpoint at seq" in out and "1 signed checkpoint" in out
    call_command("audit_checkpoint")  # every chain
    with pytest.raises(CommandError, match="no organisation"):
        call_command("audit_checkpoint", org="nope")

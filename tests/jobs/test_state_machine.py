"""Every legal and every illegal transition, through the one transition function."""

import itertools

import pytest

from audit.models import AuditEvent
from jobs.models import Job, JobEvent, JobState
from jobs.state import TRANSITIONS, InvalidTransition, transition
from outbox.models import DomainEvent
from tests.conftest import SYSTEM
from tests.jobs.conftest import submit

STATES = list(JobState.values)
PAIRS = list(itertools.product(STATES, STATES))
LEGAL = [(a, b) for a, b in PAIRS if b in TRANSITIONS[a]]
ILLEGAL = [(a, b) for a, b in PAIRS if b not in TRANSITIONS[a]]


def test_the_table_matches_the_design():
    assert {
        "pending_approval": {"queued", "rejected", "cancelled"},
        "queued": {"launching", "cancelled"},
        "launching": {"running", "failed", "cancelled", "queued", "succeeded"},
        "running": {"succeeded", "failed", "cancelled", "queued", "preempting"},
        "preempting": {"queued", "cancelled", "succeeded"},
        "succeeded": set(),
        "failed": set(),
        "cancelled": set(),
        "rejected": set(),
    } == TRANSITIONS


def job_in(world, template, state):
    job = submit(world, template)
    Job.objects.filter(pk=job.pk).update(state=state)
    return job


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL, ids=lambda s: s)
def test_legal_transition(world, template, from_state, to_state):
    job = job_in(world, template, from_state)
    events, audits, outbox = (
        JobEvent.objects.count(),
        AuditEvent.objects.count(),
        DomainEvent.objects.count(),
    )
    moved = transition(job.pk, to_state, actor=SYSTEM, reason="test")
    assert moved.state == to_state
    assert Job.objects.get(pk=job.pk).state == to_state
    event = JobEvent.objects.latest("id")
    assert (event.from_state, event.to_state, event.reason) == (from_state, to_state, "test")
    assert JobEvent.objects.count() == events + 1
    assert AuditEvent.objects.count() == audits + 1
    assert AuditEvent.objects.latest("id").changes == {"state": [from_state, to_state]}
    assert DomainEvent.objects.count() > outbox
    if to_state in ("succeeded", "failed", "cancelled", "rejected"):
        assert moved.finished_at is not None


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL, ids=lambda s: s)
def test_illegal_transition_is_refused_and_changes_nothing(world, template, from_state, to_state):
    job = job_in(world, template, from_state)
    counts = (JobEvent.objects.count(), AuditEvent.objects.count(), DomainEvent.objects.count())
    with pytest.raises(InvalidTransition) as info:
        transition(job.pk, to_state, actor=SYSTEM)
    assert info.value.type == "invalid_transition" and info.value.status_code == 409
    assert Job.objects.get(pk=job.pk).state == from_state
    assert counts == (
        JobEvent.objects.count(),
        AuditEvent.objects.count(),
        DomainEvent.objects.count(),
    )


def test_illegal_transition_over_http_is_409(world, template):
    job = submit(world, template)  # auto policy: queued
    client = world.client("ws_admin")
    url = f"/api/v1/orgs/acme/workspaces/ml/jobs/{job.pk}/"
    assert client.post(url + "cancel/", {}, format="json").status_code == 200
    again = client.post(url + "cancel/", {}, format="json")
    assert again.status_code == 409
    assert again.json()["type"] == "invalid_transition"
    approve = client.post(url + "approve/", {}, format="json")
    assert approve.status_code == 409

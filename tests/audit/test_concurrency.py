"""Many writers append to one chain at once, on PostgreSQL (its own module: it needs committed
transactions on several connections): every event gets its own seq, each links to the one
before, and the chain verifies."""

import itertools
import threading

import pytest
from django.db import connection

from audit import services as audit
from audit.chain import org_chain, verify_chain
from audit.context import Actor
from audit.models import AuditChainHead, AuditEvent
from tests.conftest import build_world
from workspaces.models import Organization


def _writers(count, work):
    errors, start = [], threading.Barrier(count)

    def run(n):
        try:
            start.wait()
            work(n)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_chain_one_after_another():
    world = build_world()
    chain = org_chain(world.org.pk)
    before = AuditEvent.objects.filter(chain=chain).count()

    def work(n):
        actor = Actor.system(f"writer-{n}")
        for i in range(25):
            if i % 5 == 4:  # batches too, some through the admission's path
                entries = [{"action": "org.update", "target": world.org, "changes": {"i": i}}] * 3
                audit.record_many(actor=actor, organization=world.org, entries=entries)
            else:
                audit.record(actor=actor, action="org.update", target=world.org,
                             organization=world.org, changes={"n": n, "i": i})  # fmt: skip

    _writers(6, work)
    added = 6 * (20 + 5 * 3)
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, before + added + 1))
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))
    result = verify_chain(chain)
    assert result.ok and result.checked == before + added, result.first_broken


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_appends_open_a_chain_once():
    organization = Organization.objects.create(slug="fresh", name="Fresh")
    chain = org_chain(organization.pk)
    assert not AuditChainHead.objects.filter(chain=chain).exists()

    def work(n):
        audit.record(actor=Actor.system(f"writer-{n}"), action="org.update",
                     target=organization, organization=organization)  # fmt: skip

    _writers(8, work)
    assert AuditChainHead.objects.get(chain=chain).seq == 8
    assert verify_chain(chain).ok


@pytest.mark.django_db(transaction=True)
def test_verify_while_writers_append():
    """Verify reads the head after the events it read: appends that land meanwhile are not a
    broken chain."""
    world = build_world()
    chain = org_chain(world.org.pk)
    results = []

    def work(n):
        if n == 0:
            for _ in range(10):
                results.append(verify_chain(chain))
            return
        for i in range(40):
            audit.record(actor=Actor.system("w"), action="org.update", target=world.org,
                         organization=world.org, changes={"i": i})  # fmt: skip

    _writers(3, work)
    assert all(result.ok for result in results), [r.first_broken for r in results]
    assert verify_chain(chain).ok

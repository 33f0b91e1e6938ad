"""The audit chain's two costs, each against a baseline measured in the same run:

- append: the median of ``audit.record`` (one event, its own transaction) against a one-row
  INSERT + COMMIT of a row as wide on the same connection, interleaved;
- verify: ``verify_chain`` over a chain of ``--events`` events (seeded through the real append,
  ``record_many`` in batches) against sha256 over the same hash inputs held in memory.

    .venv/bin/python bench/audit.py [--events 1000000] [--appends 2000]
"""

from __future__ import annotations

import argparse
import hashlib
import time

from common import configure, median, percentile


def _entries(start: int, count: int, org) -> list[dict]:
    """Events as the services write them: names, roles, limits; one in a hundred has a float
    (the slow road of the canonical form)."""
    entries = []
    for n in range(start, start + count):
        changes: dict = {"name": [f"ws-{n}", f"ws-{n + 1}"], "role": [None, "developer"]}
        if n % 100 == 0:
            changes["approval_thresholds"] = [{}, {"gpu": 2.5, "cpu": 1e16}]
        entries.append(
            {
                "action": "workspace.update",
                "target_type": "workspace",
                "target_id": n,
                "target_repr": f"Workspace {n}",
                "changes": changes,
                "metadata": {"via": "bench", "n": n},
            }
        )
    return entries


def bench_append(org, actor, count: int) -> None:
    """Interleaved, so all three see the same machine: ``audit.record`` outside a transaction
    (it commits on its own), a one-row INSERT that commits on its own (one round trip), and
    the same INSERT in Django's ``transaction.atomic`` (BEGIN, INSERT, COMMIT)."""
    from django.db import connection, transaction

    from audit import services as audit

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE bench_row (id bigserial PRIMARY KEY, at timestamptz, label text,"
            " changes jsonb, prev_hash varchar(64), hash varchar(64))"
        )
    entry = _entries(1, 1, org)[0]
    insert = (
        "INSERT INTO bench_row (at, label, changes, prev_hash, hash)"
        " VALUES (%s::timestamptz, %s, %s::jsonb, %s, %s)"
    )
    row = ["now", "system:bench", '{"name": ["a", "b"]}', "0" * 64, "1" * 64]
    samples: dict[str, list[float]] = {"append": [], "insert": [], "atomic": []}
    for n in range(count):
        started = time.perf_counter()
        audit.record(actor=actor, organization=org, **{**entry, "target_id": n})
        samples["append"].append(time.perf_counter() - started)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(insert, row)
        samples["insert"].append(time.perf_counter() - started)
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(insert, row)
        samples["atomic"].append(time.perf_counter() - started)

    def line(label: str, values: list[float]) -> str:
        return (
            f"  {label}: median {median(values) * 1000:.3f} ms,"
            f" p95 {percentile(values, 95) * 1000:.3f} ms"
        )

    a, b, c = (median(samples[name]) for name in ("append", "insert", "atomic"))
    print(f"append ({count} events, each committed on its own)")
    print(line("audit.record", samples["append"]))
    print(line("INSERT, autocommit", samples["insert"]))
    print(line("BEGIN + INSERT + COMMIT", samples["atomic"]))
    print(f"  ratio to INSERT, autocommit: {a / b:.2f}x; to BEGIN + INSERT + COMMIT: {a / c:.2f}x")


def seed(org, actor, events: int, batch: int) -> None:
    from audit import services as audit

    started = time.perf_counter()
    for start in range(1, events + 1, batch):
        count = min(batch, events + 1 - start)
        audit.record_many(actor=actor, organization=org, entries=_entries(start, count, org))
    took = time.perf_counter() - started
    print(f"seeded {events} events through record_many in {took:.1f} s ({batch} per call)")


def sha256_in_memory(chain: str) -> tuple[float, int]:
    """sha256 of the chain over the very hash inputs verify computes, read and canonicalised
    beforehand (a chunk at a time, so memory stays bounded), timing only the hashing."""
    from audit.chain import CHUNK_SIZE, JSONReader, _from_skeleton, _stream

    reader = JSONReader()
    hashing, total_bytes, chunk = 0.0, 0, []

    def flush() -> float:
        started = time.perf_counter()
        for data in chunk:
            hashlib.sha256(data).hexdigest()
        return time.perf_counter() - started

    for _, link, _, _, _, version, changes, metadata, head, middle, tail, plain in _stream(
        chain, 1
    ):
        reader.plain_numbers = True
        changes, metadata = reader.read(changes), reader.read(metadata)
        plain = plain and reader.plain_numbers
        data = link.encode() + _from_skeleton(version, head, middle, tail, changes, metadata, plain)
        total_bytes += len(data)
        chunk.append(data)
        if len(chunk) >= CHUNK_SIZE * 20:
            hashing += flush()
            chunk = []
    hashing += flush()
    return hashing, total_bytes


def bench_verify(org, events: int) -> None:
    from audit.chain import org_chain, verify_chain

    chain = org_chain(org.pk)
    started = time.perf_counter()
    result = verify_chain(chain)
    took = time.perf_counter() - started
    assert result.ok and result.checked == events, result
    hashing, total_bytes = sha256_in_memory(chain)
    print(f"verify ({events} events, {total_bytes / events:.0f} bytes hashed per event)")
    print(f"  verify_chain: {took:.2f} s, {took / events * 1e6:.2f} µs per event")
    print(f"  sha256 in memory: {hashing:.2f} s")
    print(f"  ratio: {took / hashing:.1f}x")
    print(f"  per million events: {took / events * 1e6:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000, help="events verify reads")
    parser.add_argument("--appends", type=int, default=2000, help="single appends timed")
    parser.add_argument("--batch", type=int, default=1000, help="events per seeding call")
    options = parser.parse_args()
    configure("manta_bench_audit")
    from audit.context import Actor
    from workspaces import services

    actor = Actor.system("bench")
    appended, _ = services.org_create(actor=actor, slug="append", name="", owner_email="a@b.test")
    verified, _ = services.org_create(actor=actor, slug="verify", name="", owner_email="v@b.test")
    bench_append(appended, actor, options.appends)
    # org_create's own events open the chain: seed the rest.
    from audit.models import AuditChainHead

    already = AuditChainHead.objects.get(chain=f"org:{verified.pk}").seq
    seed(verified, actor, options.events - already, options.batch)
    bench_verify(verified, options.events)


if __name__ == "__main__":
    main()

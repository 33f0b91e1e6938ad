"""The rows a job submission writes, three ways in one run: ``config.db.insert_rows`` (its
INSERT kept per connection), ``bulk_create`` and ``Model.save`` — CPU per call in this process
(Python, not PostgreSQL), the best of ``--rounds`` rounds of ``--calls`` calls each, every
round rolled back.

    .venv/bin/python bench/inserts.py [--calls 300] [--rounds 3]

Uses the submit benchmark's database and world (``BENCH_SUBMIT_DB``, bench/submit.py). Run it
from the repository's root (see bench/profile_submit.py).
"""

from __future__ import annotations

import argparse
import time

from submit import set_up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    _, world = set_up()
    from django.db import transaction

    from config.db import insert_rows
    from jobs import services as job_services
    from jobs.models import Job, JobEvent, JobTemplate
    from outbox.models import DomainEvent

    template = JobTemplate.objects.get(pk=world["template"].pk)
    job = job_services.job_submit(actor=world["dev"], workspace=world["ws"], template=template)
    values = {field.attname: getattr(job, field.attname) for field in Job._meta.fields}

    def timeline() -> list:
        return [JobEvent(job=job, to_state="queued", kind="submitted", data={"template": "b"})]

    def outbox() -> list:  # a submission emits two
        return [
            DomainEvent(type=kind, organization=job.organization, workspace=job.workspace,
                        payload={"job": job.pk, "state": "queued"})
            for kind in ("job.submitted", "job.queued")
        ]  # fmt: skip

    def a_job() -> list:
        return [Job(**{**values, "id": None, "created_at": None, "updated_at": None})]

    ways = {
        "insert_rows": insert_rows,
        "bulk_create": lambda model, objs: model.objects.bulk_create(objs),
        "save": lambda model, objs: [obj.save(force_insert=True) for obj in objs],
    }
    for name, make in (("a timeline entry", timeline), ("two outbox events", outbox),
                       ("the job", a_job)):  # fmt: skip
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(options.rounds):
            for way, insert in ways.items():
                with transaction.atomic():
                    started = time.process_time()
                    for _ in range(options.calls):
                        objs = make()
                        insert(type(objs[0]), objs)
                    spent = (time.process_time() - started) / options.calls * 1000
                    best[way] = min(best[way], spent)
                    transaction.set_rollback(True)
        print(f"{name}: " + ", ".join(f"{way} {ms:.3f} ms" for way, ms in best.items()))


if __name__ == "__main__":
    main()

"""A large admission pass writes its rows with COPY (config/db.py): every row must be the same
as the ORM would have written — timestamps set, defaults kept, the audit chain intact."""

from audit.chain import org_chain, verify_chain
from audit.models import AuditEvent
from config.db import COPY_ABOVE
from jobs import admission
from jobs.models import Job, JobAttempt, JobEvent
from quotas.models import Reservation
from tests.quotas.test_admission import queue_job, setup_quota, two_workspaces  # noqa: F401


def test_a_pass_above_the_copy_threshold_writes_complete_rows(two_workspaces):  # noqa: F811
    world, spaces, templates = two_workspaces
    count = COPY_ABOVE + 10
    jobs = [
        queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=count - n)
        for n in range(count)
    ]
    setup_quota(world, count, "fifo")
    audit_before = AuditEvent.objects.count()

    assert admission.admit(world.org.pk) == jobs

    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {"launching"}
    events = JobEvent.objects.filter(job_id__in=jobs, kind="launching")
    assert events.count() == count
    assert all(e.created_at and e.data == {"attempt": 1} for e in events)
    attempts = JobAttempt.objects.filter(job_id__in=jobs)
    assert sorted(attempts.values_list("job_id", flat=True)) == jobs
    assert all(a.number == 1 and a.state == "launching" and a.created_at for a in attempts)
    assert all(a.cluster_name.startswith("manta-acme-ml-") for a in attempts)
    held = Reservation.objects.filter(job_id__in=jobs, released_at__isnull=True)
    assert held.count() == count and all(r.gpu == 1 and r.created_at for r in held)
    assert AuditEvent.objects.count() == audit_before + count
    assert verify_chain(org_chain(world.org.pk)).ok

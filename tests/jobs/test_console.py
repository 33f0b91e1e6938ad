"""The org admins' console in the admin panel (jobs/admin.py, jobs/console.py): scoped to the
organisations the user administers, decisions through the services (state, timeline, audit),
bad input refused without a change, the overview's numbers and history from the data, and
tenant text always escaped."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from jobs import admission, console
from jobs.models import Job, JobEvent, JobState
from quotas.models import WorkspaceQuota
from tests.factories import (
    JobAttemptFactory,
    JobEventFactory,
    JobFactory,
    OrgQuotaFactory,
    QuotaGroupFactory,
    ReservationFactory,
    WorkspaceFactory,
    WorkspaceQuotaFactory,
)
from tests.quotas.test_admission import bare_template, queue_job, setup_quota

INBOX = "/admin/jobs/job/inbox/"
HOSTILE = '<script>alert("owned")</script><img src=x onerror=alert(1)>'


def admin_client(world, who="org_admin", **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(world.users[who])
    return client


def pending(world, **kwargs) -> Job:
    return JobFactory(
        workspace=world.ws,
        submitted_by=world.users["developer"],
        state=JobState.PENDING_APPROVAL,
        **kwargs,
    )


def job_page(job) -> str:
    return f"/admin/jobs/job/{job.pk}/change/"


def overview(org) -> str:
    return f"/admin/jobs/job/overview/{org.slug}/"


# --- scoping -------------------------------------------------------------------------------------


def test_another_orgs_admin_gets_404_everywhere_and_changes_nothing(world):
    job = pending(world)
    foreign = admin_client(world, "foreign")
    assert foreign.get(overview(world.org)).status_code == 404
    assert foreign.get(job_page(job)).status_code == 404
    assert (
        foreign.post(f"/admin/jobs/job/{job.pk}/decide/", {"action": "approve"}).status_code == 404
    )
    inbox = foreign.get(INBOX)
    assert inbox.status_code == 200 and f'value="{job.pk}"' not in inbox.content.decode()
    refused = foreign.post(INBOX, {"jobs": [job.pk], "decision": "approve"})
    assert refused.status_code == 400
    assert f"Jobs: job {job.pk} is not waiting for your approval" in refused.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.PENDING_APPROVAL
    assert not AuditEvent.objects.filter(action="job.approve").exists()
    # Their own organisation is theirs to see.
    assert foreign.get(overview(world.other_org)).status_code == 200


def test_people_who_administer_no_org_are_sent_to_log_in(world):
    job = pending(world)
    developer = admin_client(world, "developer")  # not staff
    for url in (overview(world.org), INBOX, job_page(job)):
        response = developer.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
    assert Client().get(INBOX).status_code == 302


def test_the_index_links_each_administered_org_with_its_pending_count(world):
    pending(world)
    pending(world)
    page = admin_client(world).get("/admin/").content.decode()
    assert f'href="{overview(world.org)}"' in page
    assert "2 jobs" in page
    assert overview(world.other_org) not in page
    assert "/static/manta/console.css" in page and "Manta console" in page


# --- the approvals inbox -------------------------------------------------------------------------


def test_inbox_approves_many_through_the_service_with_audit(world):
    first, second, other = pending(world), pending(world), pending(world)
    client = admin_client(world)
    page = client.get(INBOX).content.decode()
    assert all(f'value="{job.pk}"' in page for job in (first, second, other))
    response = client.post(INBOX, {"jobs": [first.pk, second.pk], "decision": "approve"})
    assert response.status_code == 302
    states = dict(
        Job.objects.filter(pk__in=[first.pk, second.pk, other.pk]).values_list("pk", "state")
    )
    assert states == {first.pk: "queued", second.pk: "queued", other.pk: "pending_approval"}
    audits = AuditEvent.objects.filter(action="job.approve").order_by("id")
    assert [a.target_id for a in audits] == [str(first.pk), str(second.pk)]
    assert {a.actor_id for a in audits} == {world.users["org_admin"].pk}
    assert f"Approved job(s) {first.pk}, {second.pk}" in client.get(INBOX).content.decode()


def test_inbox_rejects_with_the_typed_reason(world):
    job = pending(world)
    reason = "no GPUs for hyper-parameter sweeps this quarter"
    response = admin_client(world).post(
        INBOX, {"jobs": [job.pk], "decision": "reject", "reason": f"  {reason}  "}
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == "rejected" and job.decision_reason == reason
    assert job.decided_by == world.users["org_admin"]
    audit = AuditEvent.objects.get(action="job.reject", target_id=str(job.pk))
    assert audit.metadata["reason"] == reason and audit.actor_id == world.users["org_admin"].pk
    assert JobEvent.objects.get(job=job, kind="rejected").reason == reason


@pytest.mark.parametrize("reason", ["", "   \n "])
def test_inbox_refuses_a_rejection_without_a_reason_and_changes_nothing(world, reason):
    job = pending(world)
    audits = AuditEvent.objects.count()
    response = admin_client(world).post(
        INBOX, {"jobs": [job.pk], "decision": "reject", "reason": reason}
    )
    assert response.status_code == 400
    assert "Reason: a rejection needs a reason" in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.PENDING_APPROVAL and job.decision_reason == ""
    assert AuditEvent.objects.count() == audits


def test_inbox_refuses_no_selection_and_an_unknown_decision(world):
    job = pending(world)
    client = admin_client(world)
    none = client.post(INBOX, {"decision": "approve"})
    assert none.status_code == 400 and "Jobs: choose at least one job" in none.content.decode()
    odd = client.post(INBOX, {"jobs": [job.pk], "decision": "delete"})
    assert odd.status_code == 400 and "Decision: " in odd.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.PENDING_APPROVAL


def test_a_refused_decision_is_reported_and_the_others_go_through(world):
    own = JobFactory(
        workspace=world.ws, submitted_by=world.users["org_admin"], state=JobState.PENDING_APPROVAL
    )
    other = pending(world)
    client = admin_client(world)
    client.post(INBOX, {"jobs": [own.pk, other.pk], "decision": "approve"})
    own.refresh_from_db()
    other.refresh_from_db()
    assert own.state == "pending_approval" and other.state == "queued"
    page = client.get(INBOX).content.decode()
    assert f"Job {own.pk}: a submitter cannot decide on their own job" in page


def test_forms_need_their_csrf_token(world):
    job = pending(world)
    client = admin_client(world, enforce_csrf_checks=True)
    assert client.post(INBOX, {"jobs": [job.pk], "decision": "approve"}).status_code == 403
    decide = f"/admin/jobs/job/{job.pk}/decide/"
    assert client.post(decide, {"action": "approve"}).status_code == 403
    page = client.get(job_page(job)).content.decode()
    assert page.count("csrfmiddlewaretoken") >= 3  # approve, reject, cancel
    job.refresh_from_db()
    assert job.state == JobState.PENDING_APPROVAL


# --- the job page --------------------------------------------------------------------------------


def test_job_page_decides_through_the_services(world):
    job = pending(world)
    client = admin_client(world)
    decide = f"/admin/jobs/job/{job.pk}/decide/"
    empty = client.post(decide, {"action": "reject", "reason": ""})
    assert empty.status_code == 400 and "a rejection needs a reason" in empty.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.PENDING_APPROVAL
    assert client.post(decide, {"action": "approve"}).status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    again = client.post(decide, {"action": "approve"})
    assert again.status_code == 409 and f"Job {job.pk}:" in again.content.decode()
    assert client.post(decide, {"action": "cancel", "reason": "wrong data set"}).status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    audit = AuditEvent.objects.get(action="job.cancel", target_id=str(job.pk))
    assert audit.metadata["reason"] == "wrong data set"


def test_job_page_shows_attempts_phases_log_timeline_and_dashboard(world):
    now = timezone.now()
    job = JobFactory(workspace=world.ws, state=JobState.RUNNING, started_at=now)
    JobEventFactory(job=job, to_state="queued")
    failed = JobAttemptFactory(
        job=job,
        state="failed",
        failure_reason="cluster_lost",
        launch_started_at=now - dt.timedelta(seconds=100),
        cluster_ready_at=now - dt.timedelta(seconds=90),
        submitted_at=now - dt.timedelta(seconds=88),
        running_at=now - dt.timedelta(seconds=85),
        finished_at=now - dt.timedelta(seconds=60),
        torn_down_at=now - dt.timedelta(seconds=58),
        submitted=True,
    )
    running = JobAttemptFactory(
        job=job,
        launch_started_at=now - dt.timedelta(seconds=50),
        cluster_ready_at=now - dt.timedelta(seconds=41.5),
        log_archive="step 1\nstep 2\nfinal line of attempt 2\n",
    )
    assert [p["label"] for p in console.attempt_phases(failed, now=now)] == [
        "waiting for a worker", "cluster start", "submit", "driver start", "run", "teardown",
    ]  # fmt: skip
    [(_label, seconds)] = [
        (p["label"], p["seconds"])
        for p in console.attempt_phases(running, now=now)
        if p["label"] == "cluster start"
    ]
    assert seconds == 8.5
    page = admin_client(world).get(job_page(job)).content.decode()
    assert "Attempt 1" in page and "Attempt 2" in page and "cluster_lost" in page
    assert "cluster start" in page and "8.5 s" in page and "25 s" in page  # attempt 1 ran 25 s
    assert "final line of attempt 2" in page  # the latest attempt's log
    dashboard = f"/api/v1/orgs/acme/workspaces/ml/jobs/{job.pk}/dashboard/"
    assert f'href="{dashboard}"' in page
    assert 'id="cancel-form"' in page and 'id="approve-form"' not in page


def test_phases_join_across_a_moment_never_recorded(world):
    now = timezone.now()
    quick = JobAttemptFactory(
        job=JobFactory(workspace=world.ws, state=JobState.SUCCEEDED),
        state="succeeded",
        launch_started_at=now - dt.timedelta(seconds=30),
        cluster_ready_at=now - dt.timedelta(seconds=20),
        submitted_at=now - dt.timedelta(seconds=19),
        finished_at=now - dt.timedelta(seconds=17),  # seen only once it had ended
    )
    phases = [
        (p["label"], p["seconds"], p["ongoing"]) for p in console.attempt_phases(quick, now=now)
    ]
    assert phases[1:] == [
        ("cluster start", 10, False),
        ("submit", 1, False),
        ("driver start + run", 2, False),
        ("teardown", 17, True),
    ]


def test_job_page_says_why_a_job_waits_and_that_an_ended_one_has_no_dashboard(world):
    waiting = pending(world)
    page = admin_client(world).get(job_page(waiting)).content.decode()
    assert "for an admin's approval" in page and 'id="reject-form"' in page
    queued = JobFactory(workspace=world.ws)
    page = admin_client(world).get(job_page(queued)).content.decode()
    assert re.search(r"position \d+ of \d+ in the queue", page)
    assert re.search(r'id="job-predicted">around \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(by ', page)
    ended = JobFactory(workspace=world.ws, state=JobState.SUCCEEDED)
    page = admin_client(world).get(job_page(ended)).content.decode()
    assert "its cluster and dashboard are gone" in page and "/dashboard/" not in page
    assert 'id="job-actions"' not in page


def test_job_page_says_which_job_a_job_that_fits_waits_behind(world):
    # fifo, 3 GPUs: a 2-GPU job runs, the next 2-GPU job waits for the GPU it lacks, and a
    # 1-GPU job that would fit waits behind it. Its page names the job it waits for.
    template = bare_template(world.ws)
    setup_quota(world, 3, "fifo")
    running = queue_job(world, world.ws, template, 2, minutes_ago=30)
    assert admission.admit(world.org.pk) == [running]
    head = queue_job(world, world.ws, template, 2, minutes_ago=20)
    small = queue_job(world, world.ws, template, 1, minutes_ago=10)
    page = admin_client(world).get(job_page(Job.objects.get(pk=small))).content.decode()
    waiting = re.search(r'id="job-waiting">(.*?)</dd>', page, re.S).group(1)
    assert waiting == (
        f"position 2 of 2 in the queue: behind job {head}, which comes before it and waits "
        "(organisation gpu capacity 3: 2 reserved, this job needs 2): under fifo no job starts "
        "before an earlier one"
    )


def test_hostile_tenant_text_is_escaped(world):
    job = pending(world, name=HOSTILE[:100], approval_reason=HOSTILE)
    JobAttemptFactory(
        job=JobFactory(workspace=world.ws, name="runner", state=JobState.RUNNING),
        log_archive=f"ok\n{HOSTILE}\n</pre><script>alert(2)</script>\n",
    )
    hostile_ws = WorkspaceFactory(organization=world.org, slug="evil", name=HOSTILE)
    client = admin_client(world)
    runner = Job.objects.get(name="runner", workspace=world.ws)
    pages = {
        "job": client.get(job_page(job)).content.decode(),
        "log": client.get(job_page(runner)).content.decode(),
        "inbox": client.get(INBOX).content.decode(),
        "overview": client.get(overview(world.org)).content.decode(),
    }
    for where, page in pages.items():
        assert "<script>alert" not in page, where
        assert "<img src=x" not in page, where
    assert "&lt;script&gt;alert(&quot;owned&quot;)&lt;/script&gt;" in pages["job"]
    assert "&lt;/pre&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in pages["log"]
    assert "&lt;img src=x onerror=alert(1)&gt;" in pages["overview"]
    assert hostile_ws.slug in pages["overview"]


# --- the overview --------------------------------------------------------------------------------


def quota_world(world):
    OrgQuotaFactory(organization=world.org, cpu=32, memory_gb=128, gpu=4, max_running_jobs=10)
    WorkspaceQuotaFactory(
        workspace=world.ws,
        guaranteed_cpu=8,
        limit_cpu=16,
        guaranteed_gpu=1,
        limit_gpu=2,
        gpu_hours_per_month=100,
    )
    second = WorkspaceFactory(organization=world.org, slug="research", name="Research")
    for cpu, gpu in ((2, 1), (4, 0)):
        spec_job = JobFactory(workspace=world.ws, state=JobState.RUNNING)
        ReservationFactory(job=spec_job, cpu=cpu, memory_gb=4, gpu=gpu)
    JobFactory(workspace=world.ws)  # queued
    JobFactory(workspace=second)  # queued
    pending(world)
    return second


def test_overview_numbers_match_the_data(world):
    second = quota_world(world)
    now = timezone.now()
    gpu_job = Job.objects.filter(workspace=world.ws, state="running").first()
    Job.objects.filter(pk=gpu_job.pk).update(requested_gpu=2)
    JobAttemptFactory(job=gpu_job, running_at=now - dt.timedelta(hours=3))  # 6 GPU-hours so far
    data = console.org_overview(world.org, now=now)
    rows = {row["workspace"].slug: row for row in data["workspaces"]}
    ml = rows["ml"]
    assert (ml["running"], ml["queued"], ml["pending_approval"]) == (2, 1, 1)
    assert (rows["research"]["queued"], rows["research"]["running"]) == (1, 0)
    cpu = {bar.resource: bar for bar in ml["bars"]}["cpu"]
    assert (cpu.guaranteed, cpu.limit, cpu.in_use, cpu.scale) == (8, 16, 6, 32)
    assert (cpu.guaranteed_pct, cpu.limit_pct, cpu.in_use_pct) == (25, 50, 18.75)
    assert ml["gpu_hours"] == pytest.approx(6, abs=0.01) and ml["gpu_budget"] == 100
    assert data["totals"] == {
        "queued": 2, "running": 2, "pending_approval": 1,
        "gpu_hours": pytest.approx(6, abs=0.01), "gpu_budget": 100,
    }  # fmt: skip
    assert {bar.resource: bar.in_use for bar in data["capacity_bars"]} == {
        "cpu": 6, "memory_gb": 8, "gpu": 1,
    }  # fmt: skip
    page = admin_client(world).get(overview(world.org)).content.decode()
    assert re.search(r'id="card-queued">.*?manta-figure">2<', page, re.S)
    assert re.search(r'id="card-running">.*?manta-figure">2<', page, re.S)
    assert 'width="18.75"' in page and 'x1="25.00"' in page  # ml's CPU bar: in use, guaranteed
    assert page.count("<polyline") == 3 and second.name in page


def test_history_is_rebuilt_from_reservations_and_timelines(world):
    now = timezone.now().replace(minute=30)
    hour = now.replace(minute=0, second=0, microsecond=0)
    job = JobFactory(workspace=world.ws, state=JobState.RUNNING)
    held = ReservationFactory(job=job, cpu=4, memory_gb=1, gpu=0)  # held for the last 5 hours
    done = ReservationFactory(job=JobFactory(workspace=world.ws, state="succeeded"), cpu=2, gpu=1)
    type(held).objects.filter(pk=held.pk).update(created_at=hour - dt.timedelta(hours=5))
    type(done).objects.filter(pk=done.pk).update(
        created_at=hour - dt.timedelta(hours=30), released_at=hour - dt.timedelta(hours=20)
    )
    queued = JobFactory(workspace=world.ws)  # in the queue since 3 hours ago
    event = JobEventFactory(job=queued, to_state="queued")
    JobEvent.objects.filter(pk=event.pk).update(created_at=hour - dt.timedelta(hours=3))
    cpu, gpu, queue = console.history(world.org.pk, now=now, in_use={"cpu": 4}, queued=1)
    assert len(cpu.samples) == console.HISTORY_DAYS * 24 + 1
    # Sample -1 - k is the level at the end of the hour that began k hours before this one.
    assert cpu.samples[-1] == 4 and cpu.samples[-6] == 4 and cpu.samples[-7] == 0
    assert cpu.samples[-21] == 0 and cpu.samples[-22] == 2 and cpu.samples[-31] == 2
    assert cpu.samples[-32] == 0
    assert gpu.samples[-22] == 1 and gpu.samples[-21] == 0 and gpu.peak == 1
    assert queue.samples[-4] == 1 and queue.samples[-5] == 0 and queue.latest == 1
    assert cpu.points.count(",") == len(cpu.samples) and len(cpu.day_marks) in (6, 7)


def test_overview_costs_the_same_queries_whatever_the_number_of_jobs(world):
    quota_world(world)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            console.org_overview(world.org)
        return len(captured)

    few = queries()
    for _ in range(15):
        job = JobFactory(workspace=world.ws, state=JobState.RUNNING, requested_gpu=1)
        ReservationFactory(job=job)
        JobAttemptFactory(job=job, running_at=timezone.now())
        JobEventFactory(job=job, to_state="queued")
    WorkspaceFactory(organization=world.org, slug="third")
    assert queries() == few == 13


def test_overview_draws_the_quota_tree_with_what_each_group_holds(world):
    """Org → division → team → workspace: every group's bar holds what the workspaces under
    it hold, at any depth, and a group over its guarantee shows as borrowing."""
    second = quota_world(world)
    assert console.org_overview(world.org)["tree"] == []  # no groups: the workspaces' table only
    division = QuotaGroupFactory(
        organization=world.org, name="research-division", guaranteed_cpu=4, limit_cpu=24
    )
    team = QuotaGroupFactory(
        organization=world.org, name="vision", parent=division, guaranteed_cpu=2, limit_cpu=12
    )
    WorkspaceQuota.objects.filter(workspace=world.ws).update(group=team)
    WorkspaceQuotaFactory(workspace=second, group=division)
    rows = console.org_overview(world.org)["tree"]
    assert [(r["level"], r["name"], r["depth"]) for r in rows] == [
        ("group", "research-division", 0),
        ("group", "vision", 1),
        ("workspace", "ml", 2),
        ("workspace", "research", 1),
    ]
    cpu = {r["name"]: {b.resource: b for b in r["bars"]}["cpu"] for r in rows}
    # ml holds 2 + 4 CPUs (its two running jobs); the team and the division hold it too.
    names = ("research-division", "vision", "ml", "research")
    assert [cpu[name].in_use for name in names] == [6, 6, 6, 0]
    assert (cpu["vision"].guaranteed, cpu["vision"].limit, cpu["vision"].scale) == (2, 12, 32)
    assert cpu["vision"].borrowing and not cpu["research"].borrowing
    assert rows[0]["running"] == 2
    page = admin_client(world).get(overview(world.org)).content.decode()
    assert 'data-node="group:vision" data-depth="1"' in page
    assert 'padding-left: 3.0em">ml' in page  # the workspace under the team, two levels down

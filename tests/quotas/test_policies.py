"""The ``intelligent`` policy (strict order for priority 7-9, backfill with aging for 1-6) and
``fair_share`` with decayed past usage and weights: the order each gives, the fold of ended
reservations into past usage, the factors why-waiting shows, and the API's rules."""

import datetime as dt
import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import admission
from jobs.models import Job
from jobs.state import transition
from quotas import services as quota_services
from quotas.ledger import accrued
from quotas.models import FairShareUsage, OrgQuota, Reservation, WorkspaceQuota
from tests.admin_forms import login
from tests.conftest import SYSTEM
from tests.factories import WorkspaceFactory
from tests.quotas.test_admission import (
    admitted,
    bare_template,
    queue_job,
    setup_quota,
    still_queued,
)

DAY = 86_400.0  # the default half-life, in seconds
WS_Q = "/api/v1/orgs/acme/workspaces/ml/quota/"
ORG_Q = "/api/v1/orgs/acme/quota/"


def running(world, ws, template, gpu):
    """A job of ``ws`` admitted now that holds ``gpu`` GPUs."""
    job = queue_job(world, ws, template, gpu, minutes_ago=120)
    assert admission.admit(world.org.pk) == [job]
    return job


def used(world, ws, template, gpu, *, hours, ended_hours_ago=0.0):
    """A job of ``ws`` that held ``gpu`` GPUs for ``hours`` and ended (through the state machine)
    ``ended_hours_ago``: what it held is folded into ``ws``'s past usage."""
    job = running(world, ws, template, gpu)
    Reservation.objects.filter(job_id=job).update(
        created_at=timezone.now() - dt.timedelta(hours=hours)
    )
    transition(job, "running", actor=SYSTEM)
    transition(job, "succeeded", actor=SYSTEM)
    if ended_hours_ago:
        FairShareUsage.objects.filter(workspace=ws).update(
            as_of=timezone.now() - dt.timedelta(hours=ended_hours_ago)
        )
    return job


@pytest.fixture
def two_workspaces(world):
    other = WorkspaceFactory(organization=world.org, slug="other")
    templates = {ws.slug: bare_template(ws) for ws in (world.ws, other)}
    return world, {"ml": world.ws, "other": other}, templates


# --- intelligent ---------------------------------------------------------------------------
# Capacity 3 GPUs, of which a running job holds 2: one GPU is free.


@pytest.fixture
def one_gpu_free(two_workspaces):
    world, spaces, templates = two_workspaces
    setup_quota(world, 3, "intelligent")
    running(world, spaces["ml"], templates["ml"], 2)
    return world, spaces, templates


def test_intelligent_a_blocked_high_priority_head_blocks_lower_priorities(one_gpu_free):
    world, spaces, templates = one_gpu_free
    high = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=5, priority=8)
    low = queue_job(world, spaces["other"], templates["other"], 1, minutes_ago=30, priority=3)
    assert admitted(world) == []  # the priority-8 head needs 2 GPUs: nothing passes it
    assert still_queued(high, low)
    OrgQuota.objects.filter(organization=world.org).update(policy="round_robin")
    assert admitted(world) == [low]  # round_robin would have let it backfill


def test_intelligent_backfills_low_priorities_until_the_skipped_job_ages(one_gpu_free):
    world, spaces, templates = one_gpu_free
    blocked = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=20, priority=3)
    later = queue_job(world, spaces["other"], templates["other"], 1, minutes_ago=10, priority=3)
    assert admitted(world) == [later]  # 20 minutes < 60: the blocked job is overtaken
    assert still_queued(blocked)


def test_intelligent_an_aged_low_priority_job_is_no_longer_overtaken(one_gpu_free, settings):
    world, spaces, templates = one_gpu_free
    blocked = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=61, priority=3)
    later = queue_job(world, spaces["other"], templates["other"], 1, minutes_ago=10, priority=3)
    assert admitted(world) == []  # it waited 61 minutes > MANTA_INTELLIGENT_AGING_MINUTES (60)
    settings.MANTA_INTELLIGENT_AGING_MINUTES = 120
    assert admitted(world) == [later]
    assert still_queued(blocked)


def test_intelligent_admits_high_priorities_first_and_in_order(two_workspaces):
    world, spaces, templates = two_workspaces
    setup_quota(world, 3, "intelligent")
    low = queue_job(world, spaces["other"], templates["other"], 1, minutes_ago=30, priority=3)
    first = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=20, priority=9)
    second = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=10, priority=7)
    assert admitted(world) == [first, second, low]


# --- fair_share with history -----------------------------------------------------------------


@pytest.fixture
def fair(two_workspaces):
    """Capacity 2 GPUs, ml and other guaranteed 1 each, fair_share: one 2-GPU job at a time."""
    world, spaces, templates = two_workspaces
    for ws in spaces.values():
        WorkspaceQuota.objects.create(workspace=ws, guaranteed_gpu=1)
    setup_quota(world, 2, "fair_share")
    return world, spaces, templates


@pytest.mark.parametrize(
    "waited_minutes, guaranteed, backfilled", [(5, 3, 2), (30, 3, 0), (30, 2, 1)]
)
def test_a_big_head_that_waited_too_long_within_its_guarantee_is_not_starved(
    two_workspaces, waited_minutes, guaranteed, backfilled
):
    # Capacity 4 GPUs; other is guaranteed 1 and runs 2. ml holds nothing, so its 3-GPU head
    # comes first but does not fit, and other's 1-GPU jobs could take the 2 free GPUs. Until
    # it has waited balanced_max_wait_seconds (10 min) they may; after that they wait for it,
    # if ml is guaranteed the 3 GPUs. Beyond its guarantee it holds nothing back outright, but
    # gets a reservation in time (jobs/backfill.py): at the running job's deadline 4 GPUs are
    # free, one more than it needs, so one of the small jobs (as long as the running one) may
    # start before it.
    world, spaces, templates = two_workspaces
    WorkspaceQuota.objects.create(workspace=spaces["ml"], guaranteed_gpu=guaranteed)
    WorkspaceQuota.objects.create(workspace=spaces["other"], guaranteed_gpu=1)
    setup_quota(world, 4, "fair_share", balanced_max_wait_seconds=600)
    running(world, spaces["other"], templates["other"], 2)
    big = queue_job(world, spaces["ml"], templates["ml"], 3, minutes_ago=waited_minutes)
    small = [
        queue_job(world, spaces["other"], templates["other"], 1, minutes_ago=1) for _ in range(2)
    ]
    assert admitted(world) == small[:backfilled]
    assert still_queued(big, *small[backfilled:])


def test_the_workspace_that_used_more_waits_behind_the_one_that_did_not(fair):
    world, spaces, templates = fair
    used(world, spaces["ml"], templates["ml"], 2, hours=20)
    used(world, spaces["other"], templates["other"], 2, hours=1)
    heavy = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=30)
    light = queue_job(world, spaces["other"], templates["other"], 2, minutes_ago=10)
    # Nothing runs: both hold 0 of their guarantee, and ml's job is older. Its 40 GPU-hours
    # against other's 2 put it behind.
    assert admitted(world) == [light]
    assert still_queued(heavy)


def test_without_history_the_older_head_goes_first(fair):
    world, spaces, templates = fair
    older = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=30)
    queue_job(world, spaces["other"], templates["other"], 2, minutes_ago=10)
    assert admitted(world) == [older]


def test_past_usage_halves_after_one_half_life(fair, settings):
    world, spaces, templates = fair
    used(world, spaces["ml"], templates["ml"], 2, hours=2)
    row = FairShareUsage.objects.get(workspace=spaces["ml"])
    ledger = admission.ledger_for(world.org.pk)
    now = row.as_of
    share = ledger.usage_share(spaces["ml"].pk, now)
    # 2 GPUs for 2 hours, each moment decayed from when it was used; as an average held over
    # the decay window (× ln 2 / half-life), over the guarantee of 1.
    assert share == pytest.approx(accrued(2, 7200, DAY) * math.log(2) / DAY, rel=1e-4)
    assert ledger.usage_share(spaces["ml"].pk, now + dt.timedelta(hours=24)) == pytest.approx(
        share / 2
    )
    assert ledger.usage_share(spaces["ml"].pk, now + dt.timedelta(hours=48)) == pytest.approx(
        share / 4
    )
    settings.MANTA_FAIR_SHARE_HALF_LIFE_HOURS = 1
    short = admission.ledger_for(world.org.pk)
    assert short.past[spaces["ml"].pk].at(now + dt.timedelta(hours=1), 3600)["gpu"] == (
        pytest.approx(row.gpu / 2)
    )


def test_old_heavy_usage_decays_below_recent_light_usage(fair):
    world, spaces, templates = fair
    used(world, spaces["ml"], templates["ml"], 2, hours=10, ended_hours_ago=24 * 7)
    used(world, spaces["other"], templates["other"], 2, hours=1)
    ml_first = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=10)
    queue_job(world, spaces["other"], templates["other"], 2, minutes_ago=30)
    # ml's 20 GPU-hours were a week (7 half-lives) ago: 20/128 < other's 2 of today.
    assert admitted(world) == [ml_first]


def test_weights_change_the_order(fair):
    world, spaces, templates = fair
    used(world, spaces["ml"], templates["ml"], 2, hours=4)
    used(world, spaces["other"], templates["other"], 2, hours=1)
    heavy = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=10)
    light = queue_job(world, spaces["other"], templates["other"], 2, minutes_ago=30)
    ledger = admission.ledger_for(world.org.pk)
    now = timezone.now()
    assert ledger.fair_share_key(spaces["ml"].pk, now) > ledger.fair_share_key(
        spaces["other"].pk, now
    )
    # ml is entitled to 8 times as much: its 4 hours count as half an hour.
    WorkspaceQuota.objects.filter(workspace=spaces["ml"]).update(fair_share_weight=8)
    assert admitted(world) == [heavy]
    assert still_queued(light)


def test_the_current_share_still_counts(fair):
    world, spaces, templates = fair
    OrgQuota.objects.filter(organization=world.org).update(gpu=3)
    running(world, spaces["ml"], templates["ml"], 1)  # ml holds its whole guarantee now
    mine = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=30)
    theirs = queue_job(world, spaces["other"], templates["other"], 2, minutes_ago=10)
    assert admitted(world) == [theirs]  # other (0) before ml (1 of 1), then nothing fits
    assert still_queued(mine)


# --- the fold ------------------------------------------------------------------------------


def test_a_job_that_ends_folds_what_it_held_into_its_workspace_once(fair):
    world, spaces, templates = fair
    job = running(world, spaces["ml"], templates["ml"], 2)
    Reservation.objects.filter(job_id=job).update(created_at=timezone.now() - dt.timedelta(hours=1))
    assert not FairShareUsage.objects.exists()  # nothing ended yet
    transition(job, "running", actor=SYSTEM)
    assert not FairShareUsage.objects.exists()  # launching → running keeps the reservation
    transition(job, "succeeded", actor=SYSTEM)
    row = FairShareUsage.objects.get(workspace=spaces["ml"])
    assert row.gpu == pytest.approx(accrued(2, 3600, DAY), rel=1e-3)
    assert 0.97 * 7200 < row.gpu < 7200  # ≈ 2 GPU-hours, the hour's early part decayed a little
    held = Job.objects.get(pk=job).requested  # every resource it held folds, not only GPUs
    for name in ("cpu", "memory_gb", "disk_gb"):
        assert getattr(row, name) == pytest.approx(accrued(held[name], 3600, DAY), rel=1e-3)
    assert row.organization_id == world.org.pk

    assert quota_services.reservations_release([job]) == 0  # released already: nothing folds
    again = FairShareUsage.objects.get(workspace=spaces["ml"])
    assert (again.gpu, again.as_of) == (row.gpu, row.as_of)


def test_a_preempted_or_failed_job_folds_too_and_folds_add_up(fair):
    world, spaces, templates = fair
    OrgQuota.objects.filter(organization=world.org).update(gpu=4)
    WorkspaceQuota.objects.filter(workspace=spaces["ml"]).update(guaranteed_gpu=2)
    first = running(world, spaces["ml"], templates["ml"], 1)
    second = running(world, spaces["ml"], templates["ml"], 1)
    Reservation.objects.update(created_at=timezone.now() - dt.timedelta(minutes=30))
    transition([Job.objects.get(pk=first), Job.objects.get(pk=second)], "failed", actor=SYSTEM)
    row = FairShareUsage.objects.get(workspace=spaces["ml"])
    assert row.gpu == pytest.approx(2 * accrued(1, 1800, DAY), rel=1e-3)


def test_the_fold_costs_the_same_queries_for_one_job_or_many(fair):
    world, spaces, templates = fair
    OrgQuota.objects.filter(organization=world.org).update(gpu=None)

    def release(count):
        jobs = []
        for index in range(count):
            ws = ("ml", "other")[index % 2]
            jobs.append(queue_job(world, spaces[ws], templates[ws], 0, minutes_ago=1))
        admission.admit(world.org.pk)
        with CaptureQueriesContext(connection) as captured:
            assert quota_services.reservations_release(jobs) == count
        return len(captured)

    assert release(2) == release(12)
    assert FairShareUsage.objects.count() == 2


# --- why-waiting ---------------------------------------------------------------------------


def test_why_waiting_shows_the_fair_share_factors(fair):
    world, spaces, templates = fair
    used(world, spaces["ml"], templates["ml"], 2, hours=2)
    WorkspaceQuota.objects.filter(workspace=spaces["ml"]).update(fair_share_weight=2)
    running(world, spaces["other"], templates["other"], 2)
    waiting = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=15, priority=6)
    detail = world.client("developer").get(f"/api/v1/orgs/acme/workspaces/ml/jobs/{waiting}/")
    factors = detail.json()["queue"]["factors"]
    usage_share = accrued(2, 7200, DAY) * math.log(2) / DAY
    assert factors["current_share"] == 0
    assert factors["decayed_usage_share"] == pytest.approx(usage_share, rel=1e-3)
    assert factors["decayed_gpu_hours"] == pytest.approx(accrued(2, 7200, DAY) / 3600, rel=1e-3)
    assert factors["weight"] == 2
    assert factors["fair_share_key"] == pytest.approx(usage_share / 2, rel=1e-3)
    assert factors["priority"] == 6
    assert 15 * 60 <= factors["age_seconds"] < 15 * 60 + 60
    assert "band" not in factors


def test_why_waiting_shows_the_intelligent_band_and_aging(one_gpu_free):
    world, spaces, templates = one_gpu_free
    old = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=90, priority=3)
    high = queue_job(world, spaces["ml"], templates["ml"], 2, minutes_ago=1, priority=8)
    client = world.client("developer")
    base = "/api/v1/orgs/acme/workspaces/ml/jobs/"
    aged = client.get(f"{base}{old}/").json()["queue"]["factors"]
    assert (aged["band"], aged["aged"], aged["priority"]) == ("backfill", True, 3)
    assert aged["current_share"] is None  # ml holds 2 GPUs without a guarantee: infinite
    strict = client.get(f"{base}{high}/").json()["queue"]["factors"]
    assert (strict["band"], strict["aged"]) == ("strict", False)
    page = login("admin@acme.test").get(f"/admin/jobs/job/{old}/change/").content.decode()
    assert "waited past the aging time, no longer overtaken" in page  # the console shows them
    assert "share of its guarantee now ∞" in page


def test_other_policies_show_no_factors(two_workspaces):
    world, spaces, templates = two_workspaces
    setup_quota(world, 1, "fifo")
    running(world, spaces["ml"], templates["ml"], 1)
    waiting = queue_job(world, spaces["ml"], templates["ml"], 1, minutes_ago=1)
    queue = world.client("developer").get(f"/api/v1/orgs/acme/workspaces/ml/jobs/{waiting}/")
    assert "factors" not in queue.json()["queue"]


def test_the_ledger_reads_past_usage_in_one_query_whatever_the_workspaces(fair):
    world, spaces, templates = fair

    def ledger_queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            admission.ledger_for(world.org.pk)
        return len(captured)

    OrgQuota.objects.filter(organization=world.org).update(policy="fifo")
    without = ledger_queries()
    OrgQuota.objects.filter(organization=world.org).update(policy="fair_share")
    assert ledger_queries() == without + 1
    used(world, spaces["ml"], templates["ml"], 2, hours=1)
    used(world, spaces["other"], templates["other"], 2, hours=1)
    assert ledger_queries() == without + 1


# --- the API and the admin -----------------------------------------------------------------


@pytest.mark.parametrize("weight", [0, -1, "heavy", None])
def test_a_weight_must_be_a_number_above_zero(world, weight):
    response = world.client("org_admin").patch(WS_Q, {"fair_share_weight": weight}, format="json")
    assert response.status_code == 400, response.content
    assert "fair_share_weight" in response.json()["errors"]
    assert not WorkspaceQuota.objects.filter(fair_share_weight__lte=0).exists()


def test_a_weight_is_set_and_read_back(world):
    client = world.client("org_admin")
    assert client.get(WS_Q).json()["fair_share_weight"] == 1
    response = client.patch(WS_Q, {"fair_share_weight": 2.5}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["fair_share_weight"] == 2.5
    assert WorkspaceQuota.objects.get(workspace=world.ws).fair_share_weight == 2.5


def test_the_intelligent_policy_is_accepted_and_an_unknown_one_named(world):
    client = world.client("org_admin")
    response = client.patch(ORG_Q, {"policy": "intelligent"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["policy"] == "intelligent"
    wrong = client.patch(ORG_Q, {"policy": "smart"}, format="json")
    assert wrong.status_code == 400 and "policy" in wrong.json()["errors"]


def test_the_service_refuses_a_weight_of_zero_whoever_calls_it(world):
    from config.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        quota_services.workspace_quota_update(
            actor=SYSTEM, workspace=world.ws, data={"fair_share_weight": 0}
        )
    assert "fair_share_weight" in refused.value.errors

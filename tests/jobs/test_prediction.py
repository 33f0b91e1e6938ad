"""When will a queued job start: the replay of the queue over running jobs' expected ends
(their templates' history, capped by max_runtime_seconds), in a fixed number of queries."""

import datetime as dt
import math
import socket

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.context import Actor
from jobs import admission, prediction
from jobs import services as job_services
from jobs.models import AttemptState, Job, JobAttempt, JobState
from quotas import services as quota_services
from quotas.models import OrgQuota, Reservation, WorkspaceQuota
from tests.factories import JobAttemptFactory, JobFactory, JobTemplateFactory, WorkspaceFactory

MAX_RUNTIME = 3000


@pytest.fixture
def gpu_template(world):
    """Jobs of 2 GPUs each (a worker group asks for them), at most MAX_RUNTIME seconds."""
    return JobTemplateFactory(
        workspace=world.ws,
        name="train",
        version__spec_changes={
            "worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": 2}],
            "max_runtime_seconds": MAX_RUNTIME,
        },
        version__allowed_overrides=["priority", "max_runtime_seconds"],
    )


def capacity(world, gpu: float, policy: str = "fifo") -> None:
    OrgQuota.objects.update_or_create(
        organization=world.org, defaults={"gpu": gpu, "policy": policy}
    )


def submit(world, template, **overrides) -> Job:
    return job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]),
        workspace=world.ws,
        template=template,
        overrides=overrides,
    )


def run_for(world, template, *, seconds_ago: float, now=None) -> Job:
    """A job of ``template`` admitted ``seconds_ago`` before ``now``: it holds its reservation
    since then."""
    job = submit(world, template)
    assert admission.admit(world.org.pk) == [job.pk]
    Reservation.objects.filter(job=job).update(
        created_at=(now or timezone.now()) - dt.timedelta(seconds=seconds_ago)
    )
    return job


def history(template, holds: list[float]) -> None:
    """Past succeeded attempts of ``template`` that held their reservation ``holds`` seconds."""
    version = template.versions.get()
    end = timezone.now() - dt.timedelta(days=1)
    for seconds in holds:
        job = JobFactory(
            workspace=template.workspace, template_version=version, state=JobState.SUCCEEDED
        )
        attempt = JobAttemptFactory(job=job, state=AttemptState.SUCCEEDED)
        JobAttempt.objects.filter(pk=attempt.pk).update(
            created_at=end - dt.timedelta(seconds=seconds), finished_at=end
        )
        # Submitted then too: not one of the recent submissions future ones are expected from.
        Job.objects.filter(pk=job.pk).update(created_at=end - dt.timedelta(seconds=seconds))


def seconds_after(now, moment) -> float:
    return round((moment - now).total_seconds(), 3)


def test_a_job_that_fits_would_be_admitted_now(world, gpu_template):
    capacity(world, 4)
    job = submit(world, gpu_template)
    now = timezone.now()
    assert prediction.predict_start(job, now=now) == prediction.Prediction(0, None, now, now)


def test_the_queue_starts_when_the_running_jobs_are_expected_to_end(world, gpu_template):
    # Holds of 100, 200, 300, 400 and 1000 s: median 300 s, mean 400 s, p90 1000 s.
    history(gpu_template, [100, 200, 300, 400, 1000])
    capacity(world, 2)
    now = timezone.now()
    run_for(world, gpu_template, seconds_ago=60, now=now)  # 240 s more expected (p90: 940 s)
    second, third = submit(world, gpu_template), submit(world, gpu_template)

    waiting = prediction.predict_start(second, now=now)
    assert (waiting.position, waiting.blocker) == (1, "org_capacity")
    assert seconds_after(now, waiting.p50) == 240
    assert seconds_after(now, waiting.p90) == 940

    # The third starts when the second, admitted at the running job's end, is expected to end.
    behind = prediction.predict_start(third, now=now)
    assert behind.position == 2
    assert seconds_after(now, behind.p50) == 240 + 300
    assert seconds_after(now, behind.p90) == 940 + 1000


def test_in_strict_order_a_queues_holds_add_up_as_a_sum(world, gpu_template):
    """Under fifo the fourth job waits for the three ahead of it to run one after another (one
    place, held by the running job): each counts as its share of a sum of three holds, 433 s
    (test_a_hold_in_a_sum_of_holds_is_its_mean_unless_a_rare_run_makes_it), not its median,
    300 s. Under round_robin a later job may go first, and it starts at the first end that
    makes room for it: a race, which the medians stand for."""
    history(gpu_template, [100, 200, 300, 400, 1000])
    capacity(world, 2)
    now = timezone.now()
    run_for(world, gpu_template, seconds_ago=60, now=now)  # 240 s more expected
    *_, fourth = (submit(world, gpu_template) for _ in range(4))
    assert seconds_after(now, prediction.predict_start(fourth, now=now).p50) == 240 + 1300
    OrgQuota.objects.filter(organization=world.org).update(policy="round_robin")
    assert seconds_after(now, prediction.predict_start(fourth, now=now).p50) == 240 + 3 * 300


@pytest.mark.parametrize(
    ("ahead", "running", "in_a_row"),
    [(0, 5, 1), (3, 1, 3), (10, 4, 3), (8, 4, 2), (5, 0, 5), (500, 1, prediction.MAX_SUM_DRAWS)],
)
def test_the_holds_in_a_row_are_the_jobs_ahead_spread_over_the_running_places(
    ahead, running, in_a_row
):
    assert prediction._holds_in_a_row(ahead, running) == in_a_row


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        # median 300, mean 400: one hold, two, three, sixteen in a row
        ([100.0, 200.0, 300.0, 400.0, 1000.0], {1: 300.0, 2: 350.0, 3: 1300 / 3, 16: 381.25}),
        ([100.0] * 25 + [200.0] * 25, {1: 100.0, 4: 150.0, 16: 150.0}),  # median 100, mean 150
        # One run of 28 hours among 49 of 100 s (mean 2,098 s): a short sum that includes it is
        # rare, and the median of the sum stays that of 100 s holds.
        ([100.0] * 49 + [100_000.0], {1: 100.0, 4: 100.0, 16: 100.0}),
    ],
)
def test_a_hold_in_a_sum_of_holds_is_its_mean_unless_a_rare_run_makes_it(runs, expected):
    for draws, share in expected.items():
        assert prediction._hold_in_a_sum(tuple(runs), draws) == pytest.approx(share)
        # a fixed seed: the same history, the same answer
        assert prediction._hold_in_a_sum.__wrapped__(tuple(runs), draws) == pytest.approx(share)


def test_the_first_of_several_running_jobs_is_expected_to_end_before_their_median(
    world, gpu_template
):
    """Which running job ends first is a race: of three alike, the first end is expected at the
    median rank of the first of three draws, not at their common median. Holds of 100 … 1000 s
    (median 500 s): pooled, the three ends' median ranks (0.7, 1.7 and 2.7 of 3.4) fall on
    300, 500 and 800 s."""
    history(gpu_template, [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000])
    capacity(world, 6)
    now = timezone.now()
    for _ in range(3):
        run_for(world, gpu_template, seconds_ago=0, now=now)
    first, second, third = (submit(world, gpu_template) for _ in range(3))

    assert seconds_after(now, prediction.predict_start(first, now=now).p50) == 300
    assert seconds_after(now, prediction.predict_start(second, now=now).p50) == 500
    assert seconds_after(now, prediction.predict_start(third, now=now).p50) == 800
    # p90 stays each job's own 90th percentile: every one of them may run 900 s.
    assert seconds_after(now, prediction.predict_start(first, now=now).p90) == 900


def test_the_race_pools_at_most_one_templates_history_per_job():
    """A job whose history is its organisation's (thousands of runs) weighs in the race's pool
    with HISTORY_RUNS of them, evenly spread: its own median and p90 are from them all, and the
    ends come out where the whole histories would put them, within their spacing."""
    rests = [float(second) for second in range(1, 5001)]  # 1 … 5000 s
    assert prediction._release_times([rests]) == [(2500.0, 4500.0)]
    (first, _), (second, _) = prediction._release_times([rests, rests])
    # median ranks 0.7 / 2.4 and 1.7 / 2.4 of 1 … 5000 s, to within 5000 / HISTORY_RUNS
    spacing = 5000 / prediction.HISTORY_RUNS
    assert abs(first - 5000 * 0.7 / 2.4) <= spacing
    assert abs(second - 5000 * 1.7 / 2.4) <= spacing


def test_a_job_past_its_median_is_expected_at_its_p90_and_history_is_capped(world, gpu_template):
    history(gpu_template, [100, 200, 300, 400, 1000])
    capacity(world, 2)
    now = timezone.now()
    run_for(world, gpu_template, seconds_ago=500, now=now)  # past its median: p90 500 s away
    waiting = submit(world, gpu_template)
    assert seconds_after(now, prediction.predict_start(waiting, now=now).p50) == 500

    # A longer history than the running job's limit: the limit is when Manta ends it.
    history(gpu_template, [MAX_RUNTIME * 2] * 20)
    assert seconds_after(now, prediction.predict_start(waiting, now=now).p90) == MAX_RUNTIME - 500


def test_a_job_past_every_run_of_its_history_is_expected_to_last_as_long_again(world, gpu_template):
    """Its history says nothing of how much longer: as long again as it has run at the median
    (the heavy tail's estimate), nine times that at p90, never past its max runtime."""
    history(gpu_template, [100, 150, 200])
    capacity(world, 2)
    now = timezone.now()
    run_for(world, gpu_template, seconds_ago=250, now=now)  # past all three runs
    waiting = submit(world, gpu_template)
    predicted = prediction.predict_start(waiting, now=now)
    assert 240 <= seconds_after(now, predicted.p50) <= 260
    assert 8 * 250 <= seconds_after(now, predicted.p90) <= 10 * 250  # to the quantiles' spacing
    rests = prediction._remaining(prediction._runtime([100.0, 150.0, 200.0], 3000), 2000)
    assert max(rests) == 1000  # the max runtime is when Manta ends it
    assert prediction._quantile(rests, 0.5) == 1000


def test_without_history_a_job_is_expected_to_run_to_its_max_runtime(world, gpu_template):
    capacity(world, 2)
    now = timezone.now()
    run_for(world, gpu_template, seconds_ago=100, now=now)
    waiting = submit(world, gpu_template)
    predicted = prediction.predict_start(waiting, now=now)
    assert seconds_after(now, predicted.p50) == seconds_after(now, predicted.p90) == 2900


def test_a_job_that_can_never_fit_has_no_predicted_start(world, gpu_template):
    capacity(world, 2, policy="round_robin")
    run_for(world, gpu_template, seconds_ago=10)
    waiting = submit(world, gpu_template)
    OrgQuota.objects.filter(organization=world.org).update(gpu=1)  # shrunk under what it asks
    predicted = prediction.predict_start(waiting)
    assert (predicted.position, predicted.blocker) == (1, "org_capacity")
    assert predicted.p50 is None and predicted.p90 is None
    assert "does not fit" in predicted.why_unknown


def test_the_replay_follows_the_policy(world, gpu_template):
    """round_robin lets a job that fits go past a blocked head; fifo does not."""
    capacity(world, 3, policy="round_robin")
    run_for(world, gpu_template, seconds_ago=0)
    blocked = submit(world, gpu_template)
    small = submit(world, gpu_template, priority=1)
    Job.objects.filter(pk=small.pk).update(requested_gpu=1)
    small.refresh_from_db()
    assert prediction.predict_start(small).position == 0
    OrgQuota.objects.filter(organization=world.org).update(policy="fifo")
    behind = prediction.predict_start(small)
    assert (behind.position, behind.blocker) == (2, "queue_order")  # it fits on its own
    assert behind.p50 == prediction.predict_start(blocked).p50  # both when the head starts


@pytest.mark.parametrize("policy", ["fifo", "fair_share", "intelligent"])
def test_queries_are_fixed_whatever_the_queue_length(world, gpu_template, policy):
    history(gpu_template, [100, 200])
    capacity(world, 2, policy=policy)
    run_for(world, gpu_template, seconds_ago=10)
    jobs = [submit(world, gpu_template) for _ in range(3)]

    def queries(job) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert prediction.predict_start(job).p50 is not None
        return len(captured)

    short = queries(jobs[-1])
    jobs += [submit(world, gpu_template) for _ in range(30)]
    # 9 under fifo: ledger, queue, running, history; fair_share and intelligent read the
    # workspaces' past usage as well (one query): 10.
    assert queries(jobs[-1]) == short <= 12


def test_too_far_back_to_predict(world, gpu_template, monkeypatch):
    monkeypatch.setattr(prediction, "MAX_AHEAD", 3)
    capacity(world, 2)
    jobs = [submit(world, gpu_template) for _ in range(5)]
    predicted = prediction.predict_start(jobs[-1])
    assert (predicted.position, predicted.p50) == (5, None)
    assert "more than 3 queued jobs" in predicted.why_unknown
    assert prediction.predict_start(jobs[1]).p50 is not None


def test_a_queued_jobs_detail_shows_its_predicted_start(world, gpu_template):
    capacity(world, 2)
    run_for(world, gpu_template, seconds_ago=100)
    waiting = submit(world, gpu_template)
    detail = world.client("developer").get(f"/api/v1/orgs/acme/workspaces/ml/jobs/{waiting.pk}/")
    queue = detail.json()["queue"]
    assert {"position", "queued", "waiting_for"} <= set(queue)
    predicted = queue["predicted_start"]
    p50 = dt.datetime.fromisoformat(predicted["p50"])
    assert 2890 <= (p50 - timezone.now()).total_seconds() <= 2900
    assert predicted["p90"] == predicted["p50"] and predicted["why_unknown"] == ""


def test_a_detail_reuses_its_prediction_until_the_job_moves(world, gpu_template, settings):
    settings.MANTA_PREDICTION_CACHE_SECONDS = 60
    capacity(world, 2)
    run_for(world, gpu_template, seconds_ago=100)
    waiting = submit(world, gpu_template)
    first = prediction.cached_prediction(waiting)
    with CaptureQueriesContext(connection) as again:
        assert prediction.cached_prediction(waiting) == first
    assert len(again) == 0  # read back from the cache, no replay
    Job.objects.filter(pk=waiting.pk).update(queued_at=timezone.now())
    waiting.refresh_from_db()  # requeued: a new place in the queue, predicted afresh
    with CaptureQueriesContext(connection) as moved:
        prediction.cached_prediction(waiting)
    assert len(moved) > 0


def test_an_unsubmitted_job_takes_its_place_by_priority(world, gpu_template):
    capacity(world, 2)
    now = timezone.now() + dt.timedelta(seconds=30)  # after the queued jobs below
    run_for(world, gpu_template, seconds_ago=0, now=now)
    queued = [submit(world, gpu_template) for _ in range(2)]
    actor = Actor.for_user(world.users["owner"])
    urgent = job_services.job_prepare(
        actor=actor, workspace=world.ws, template=gpu_template, overrides={"priority": 9}
    )
    normal = job_services.job_prepare(actor=actor, workspace=world.ws, template=gpu_template)
    assert urgent.pk is None and normal.pk is None  # nothing saved
    first = prediction.predict_start(urgent, now=now)
    assert (first.position, seconds_after(now, first.p50)) == (1, MAX_RUNTIME)
    last = prediction.predict_start(normal, now=now)
    assert (last.position, seconds_after(now, last.p50)) == (3, 3 * MAX_RUNTIME)
    assert Job.objects.filter(state=JobState.QUEUED).count() == len(queued)


def test_fair_share_predicts_the_workspace_below_its_share_first(world, gpu_template):
    other = WorkspaceFactory(organization=world.org, slug="other")
    for workspace in (world.ws, other):
        WorkspaceQuota.objects.create(workspace=workspace, guaranteed_gpu=2)
    other_template = JobTemplateFactory(
        workspace=other,
        name="train",
        version__spec_changes=gpu_template.versions.get().spec,
    )
    capacity(world, 4, policy="fifo")
    now = timezone.now() + dt.timedelta(seconds=30)
    run_for(world, gpu_template, seconds_ago=0, now=now)  # ml holds its whole guarantee
    mine = submit(world, gpu_template)
    theirs = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]), workspace=other, template=other_template
    )
    assert prediction.predict_start(mine, now=now).position == 0  # fifo: first come
    assert prediction.predict_start(theirs, now=now).position == 2  # one job goes before it

    OrgQuota.objects.filter(organization=world.org).update(policy="fair_share")
    assert prediction.predict_start(theirs, now=now).position == 0  # other is below its share
    waiting = prediction.predict_start(mine, now=now)
    assert (waiting.position, seconds_after(now, waiting.p50)) == (2, MAX_RUNTIME)


def test_a_cache_outage_predicts_afresh_rather_than_failing(world, gpu_template, settings):
    settings.MANTA_PREDICTION_CACHE_SECONDS = 60
    settings.CACHES = {  # a Redis nobody listens on: every cache call raises
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{closed_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        }
    }
    capacity(world, 2)
    run_for(world, gpu_template, seconds_ago=100)
    waiting = submit(world, gpu_template)
    outage, fresh = prediction.cached_prediction(waiting), prediction.predict_start(waiting)
    assert (outage.position, outage.blocker) == (fresh.position, fresh.blocker)
    assert outage.p50 is not None


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_intelligent_predicts_a_low_priority_job_behind_a_blocked_high_priority_head(
    world, gpu_template
):
    small = JobTemplateFactory(
        workspace=world.ws,
        name="small",
        version__spec_changes={
            "worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": 1}],
            "max_runtime_seconds": MAX_RUNTIME,
        },
        version__allowed_overrides=["priority"],
    )
    capacity(world, 3, policy="intelligent")
    now = timezone.now() + dt.timedelta(seconds=30)
    run_for(world, gpu_template, seconds_ago=0, now=now)  # 2 of the 3 GPUs until MAX_RUNTIME
    high = submit(world, gpu_template, priority=8)  # 2 GPUs: waits for the running job
    low = submit(world, small, priority=3)  # 1 GPU: fits now, but not past a strict head
    waiting = prediction.predict_start(low, now=now)
    assert (waiting.position, seconds_after(now, waiting.p50)) == (2, MAX_RUNTIME)
    assert prediction.predict_start(high, now=now).position == 1

    OrgQuota.objects.filter(organization=world.org).update(policy="round_robin")
    assert prediction.predict_start(low, now=now).position == 0  # it would backfill


def test_fair_share_predicts_the_workspace_that_used_less_first(world, gpu_template):
    other = WorkspaceFactory(organization=world.org, slug="other")
    for workspace in (world.ws, other):
        WorkspaceQuota.objects.create(workspace=workspace, guaranteed_gpu=1)
    other_template = JobTemplateFactory(
        workspace=other, name="train", version__spec_changes=gpu_template.versions.get().spec
    )
    capacity(world, 2, policy="fair_share")  # one 2-GPU job at a time
    now = timezone.now() + dt.timedelta(seconds=30)
    mine = submit(world, gpu_template)  # the older of the two
    theirs = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]), workspace=other, template=other_template
    )
    assert prediction.predict_start(mine, now=now).position == 0  # no history: first come

    gpus = {"cpu": 0.0, "memory_gb": 0.0, "gpu": 2.0, "disk_gb": 0.0}
    quota_services.fair_share_usage_fold(  # ml held 2 GPUs for 10 hours, ending now
        [(world.org.pk, world.ws.pk, 10 * 3600, gpus)], now=now
    )
    assert prediction.predict_start(theirs, now=now).position == 0
    waiting = prediction.predict_start(mine, now=now)
    assert (waiting.position, seconds_after(now, waiting.p50)) == (2, MAX_RUNTIME)


def submitted(template, count: int, *, within: float, now, priority: int = 5) -> None:
    """``count`` jobs of ``template`` submitted evenly over the ``within`` seconds before
    ``now`` (all ended since): the recent submissions the replay takes the rate from."""
    version = template.versions.get()
    for n in range(count):
        job = JobFactory(
            workspace=template.workspace,
            template_version=version,
            state=JobState.SUCCEEDED,
            priority=priority,
        )
        Job.objects.filter(pk=job.pk).update(
            created_at=now - dt.timedelta(seconds=within * (n + 1) / count)
        )


def test_a_young_organisations_rate_is_taken_over_its_life(world, gpu_template):
    """12 submissions in the hour since the organisation was created: one every 5 minutes,
    not one every 30 (the six-hour window would spread them over five hours it did not
    exist). An organisation older than the window: over the window."""
    now = timezone.now()
    submitted(gpu_template, 12, within=3600, now=now)
    type(world.org).objects.filter(pk=world.org.pk).update(
        created_at=now - dt.timedelta(seconds=3600)
    )

    def every() -> float:
        rows = prediction._recent_submissions(world.org.pk, now)
        return prediction._arrivals(rows, world.org.pk, now).every[world.ws.pk]

    assert every() == pytest.approx(300)
    type(world.org).objects.filter(pk=world.org.pk).update(created_at=now - dt.timedelta(days=30))
    assert every() == pytest.approx(prediction.ARRIVAL_WINDOW / 12)
    # Rows older than the organisation's own record (imported): its life is at least theirs.
    type(world.org).objects.filter(pk=world.org.pk).update(created_at=now)
    assert every() == pytest.approx(300)


def two_workspaces(world, gpu_template, guarantee: float):
    other = WorkspaceFactory(organization=world.org, slug="other")
    for workspace in (world.ws, other):
        WorkspaceQuota.objects.create(workspace=workspace, guaranteed_gpu=guarantee)
    return JobTemplateFactory(
        workspace=other, name="train", version__spec_changes=gpu_template.versions.get().spec
    )


def test_a_heavy_users_job_starts_after_the_light_users_expected_submissions(world, gpu_template):
    """fair_share: a workspace that used less goes first, including with jobs it has not
    submitted yet. The light workspace submitted 12 jobs in the last 6 hours, one every 30
    minutes: the replay expects the next ones at +30 min, +60 min, …, each before the heavy
    workspace's queued job."""
    light = two_workspaces(world, gpu_template, guarantee=1)
    history(gpu_template, [1200, 1200, 1200])
    history(light, [1200, 1200, 1200])
    capacity(world, 2, policy="fair_share")  # one 2-GPU job at a time
    now = timezone.now() + dt.timedelta(seconds=30)
    submitted(light, 12, within=prediction.ARRIVAL_WINDOW, now=now)
    gpus = {"cpu": 0.0, "memory_gb": 0.0, "gpu": 2.0, "disk_gb": 0.0}
    quota_services.fair_share_usage_fold(  # ml held 2 GPUs for 10 hours, ending now
        [(world.org.pk, world.ws.pk, 10 * 3600, gpus)], now=now
    )
    run_for(world, gpu_template, seconds_ago=0, now=now)  # ends at +1200 s
    mine = submit(world, gpu_template)

    waiting = prediction.predict_start(mine, now=now)
    # At +1200 s the running job ends: nothing else is queued, so mine starts (the light
    # workspace's first expected job arrives at +1800 s, after).
    assert seconds_after(now, waiting.p50) == 1200
    assert waiting.position == 1 and waiting.overtakers == 0

    # Now the running job is expected to hold until +2000 s: by then the light workspace's
    # next job has arrived (+1800 s) and, having used less, goes first; mine starts at its
    # end (2000 + 1200), and the future job is not counted in the position.
    JobAttempt.objects.filter(job__template_version__template=gpu_template).delete()
    history(gpu_template, [2000, 2000, 2000])
    waiting = prediction.predict_start(mine, now=now)
    assert seconds_after(now, waiting.p50) == 3200
    assert waiting.position == 1 and waiting.overtakers == 1

    # Under fifo the same future job comes after mine: it cannot overtake.
    OrgQuota.objects.filter(organization=world.org).update(policy="fifo")
    under_fifo = prediction.predict_start(mine, now=now)
    assert seconds_after(now, under_fifo.p50) == 2000 and under_fifo.overtakers == 0


def test_a_higher_priority_stream_is_expected_to_go_first_even_under_fifo(world, gpu_template):
    urgent = two_workspaces(world, gpu_template, guarantee=1)
    history(gpu_template, [1000, 1000, 1000])
    capacity(world, 2, policy="fifo")
    now = timezone.now() + dt.timedelta(seconds=30)
    # The other workspace submitted 12 urgent jobs in the last 6 h: one is expected every
    # 30 min, the first at +1800 s.
    submitted(urgent, 12, within=prediction.ARRIVAL_WINDOW, now=now, priority=9)
    run_for(world, gpu_template, seconds_ago=0, now=now)
    queued = submit(world, gpu_template)
    # The running job ends at +1000 s: the queued job starts then, before any urgent arrival.
    assert seconds_after(now, prediction.predict_start(queued, now=now).p50) == 1000

    Reservation.objects.update(created_at=now + dt.timedelta(seconds=1000))  # ends at +2000 s
    # By then an urgent job arrived (+1800 s): it goes first, and mine waits for its end.
    assert seconds_after(now, prediction.predict_start(queued, now=now).p50) == 3000


def test_only_submissions_that_would_go_ahead_use_up_the_replays_bound(
    world, gpu_template, monkeypatch
):
    """Under fifo a queued job that does not fit holds back every job behind it: its own
    workspace's stream of lower-priority jobs cannot start before it, so it is not replayed
    and does not use up the bound on future submissions before the urgent one arrives."""
    urgent = two_workspaces(world, gpu_template, guarantee=1)
    history(gpu_template, [1000, 1000, 1000])
    capacity(world, 2, policy="fifo")
    now = timezone.now() + dt.timedelta(seconds=30)
    submitted(urgent, 12, within=prediction.ARRIVAL_WINDOW, now=now, priority=9)  # every 30 min
    submitted(gpu_template, 60, within=prediction.ARRIVAL_WINDOW, now=now, priority=1)
    monkeypatch.setattr(prediction, "MAX_ARRIVALS", 3)  # ml's next 3 come before +1800 s
    run_for(world, gpu_template, seconds_ago=0, now=now)
    Reservation.objects.update(created_at=now + dt.timedelta(seconds=1000))  # ends at +2000 s
    queued = submit(world, gpu_template)
    # The urgent job arrives at +1800 s and goes first; mine starts at its end.
    assert seconds_after(now, prediction.predict_start(queued, now=now).p50) == 3000
    # balanced: ml's jobs may overtake mine for its first 1000 s (two are replayed, at
    # +348 s and +697 s), not after: the urgent job is the third.
    OrgQuota.objects.filter(organization=world.org).update(
        policy="balanced", balanced_max_wait_seconds=1000
    )
    assert seconds_after(now, prediction.predict_start(queued, now=now).p50) == 3000
    # Under round_robin ml's later jobs may overtake mine (none fits before +2000 s either):
    # all three replayed submissions are ml's, and the urgent one is beyond the bound.
    OrgQuota.objects.filter(organization=world.org).update(policy="round_robin")
    assert seconds_after(now, prediction.predict_start(queued, now=now).p50) == 2000


@pytest.mark.parametrize(("bound", "made"), [(3, []), (4, [40.0]), (7, [40.0, 80.0])])
def test_submissions_passed_over_are_bounded_too(monkeypatch, bound, made):
    """Passing over a submission that would queue behind the job costs little, but a workspace
    that submits thousands an hour would make a replay walk them all: after
    ``MAX_PASSED_OVER`` of them the future ends, and what would have come later is not made."""
    monkeypatch.setattr(prediction, "MAX_PASSED_OVER", bound)
    now = timezone.now()

    def like(priority: int) -> prediction.Queued:
        return prediction.Queued(0, 1, 1, priority, now, {"gpu": 1.0}, 0, None)

    # One workspace submits every 10 s, cycling through three low-priority jobs and an urgent
    # one: the urgent ones arrive at +40 s and +80 s, after three passed over each time.
    arrivals = prediction.Arrivals({1: 10.0}, {1: [like(1), like(1), like(1), like(9)]})
    subject = like(5)
    future = prediction._Future(
        arrivals, prediction.History({}, {}, []), now, subject=subject, strict_in=0
    )
    due = [(job.queued_at - now).total_seconds() for job in future.due(3600)]
    assert due == made
    assert future.passed_over == bound


@pytest.mark.parametrize(
    ("policy", "priority", "limit"),
    [
        ("fifo", 5, 0),
        ("intelligent", 8, 0),
        ("intelligent", 5, 900),  # MANTA_INTELLIGENT_AGING_MINUTES = 15
        ("balanced", 5, 600),
        ("round_robin", 5, math.inf),
        ("fair_share", 5, math.inf),
    ],
)
def test_the_replay_stops_expecting_overtakers_when_admission_stops_letting_them(
    settings, policy, priority, limit
):
    settings.MANTA_INTELLIGENT_AGING_MINUTES = 15
    now = timezone.now()
    job = prediction.Queued(1, 1, 1, priority, now - dt.timedelta(seconds=100), {}, 0, None)
    ends = admission.overtaking_ends(job, policy, 600, now)
    assert ends == max(0, limit - 100)
    if policy == "fair_share":
        return  # its own order (the workspaces' shares), not the queue's

    # What the queue's pass decides, a second before and after:
    def overtaken(seconds: float) -> bool:
        return admission._may_be_overtaken(job, policy, 600, now + dt.timedelta(seconds=seconds))

    if ends == math.inf:
        assert overtaken(365 * 86400)
    else:
        assert not overtaken(ends + 1)
        assert overtaken(ends - 1) == (ends > 0)


def test_too_few_recent_submissions_say_nothing_about_a_rate(world, gpu_template):
    history(gpu_template, [1000, 1000, 1000])
    capacity(world, 2, policy="round_robin")
    now = timezone.now() + dt.timedelta(seconds=30)
    submitted(gpu_template, prediction.MIN_ARRIVALS - 4, within=600, now=now, priority=9)
    run_for(world, gpu_template, seconds_ago=0, now=now)
    Reservation.objects.update(created_at=now + dt.timedelta(seconds=1000))
    queued = submit(world, gpu_template)  # with the one running: MIN_ARRIVALS - 2 recent
    assert seconds_after(now, prediction.predict_start(queued, now=now).p50) == 2000


def test_fair_share_usage_grows_as_the_replayed_jobs_end(world, gpu_template):
    """The running job's hold is folded into its workspace's past usage when it ends, as
    admission does when its reservation is released: the other workspace, which used nothing,
    goes first, although ml's job was queued before it."""
    other = two_workspaces(world, gpu_template, guarantee=1)
    capacity(world, 2, policy="fair_share")
    now = timezone.now() + dt.timedelta(seconds=30)
    run_for(world, gpu_template, seconds_ago=100, now=now)  # no history: ends at +2900 s
    mine = submit(world, gpu_template)
    theirs = job_services.job_submit(
        actor=Actor.for_user(world.users["owner"]), workspace=other.workspace, template=other
    )
    assert seconds_after(now, prediction.predict_start(theirs, now=now).p50) == 2900
    waiting = prediction.predict_start(mine, now=now)
    assert (waiting.position, seconds_after(now, waiting.p50)) == (2, 2900 + MAX_RUNTIME)


def test_a_running_job_is_expected_as_the_runs_that_lasted_longer(world, gpu_template):
    # Holds of 100 … 1000 s; 250 s in, the runs it can still be are 300, 400 and 1000 s: their
    # median is 400 s (150 s more), their p90 1000 s (750 s more).
    history(gpu_template, [100, 200, 300, 400, 1000])
    capacity(world, 2)
    now = timezone.now()
    run_for(world, gpu_template, seconds_ago=250, now=now)
    predicted = prediction.predict_start(submit(world, gpu_template), now=now)
    assert (seconds_after(now, predicted.p50), seconds_after(now, predicted.p90)) == (150, 750)


def test_a_new_template_takes_its_workspaces_history(world, gpu_template):
    """A template with no runs yet is expected to run like its workspace's other templates,
    not to its max runtime."""
    history(gpu_template, [100, 200, 300])
    fresh = JobTemplateFactory(
        workspace=world.ws, name="fresh", version__spec_changes=gpu_template.versions.get().spec
    )
    capacity(world, 2)
    now = timezone.now()
    run_for(world, fresh, seconds_ago=0, now=now)
    predicted = prediction.predict_start(submit(world, gpu_template), now=now)
    assert (seconds_after(now, predicted.p50), seconds_after(now, predicted.p90)) == (200, 300)

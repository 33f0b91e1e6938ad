"""The scheduling simulator (bench/simulate.py): a small synthetic replay through the real
admission pass under every policy gives sane figures, and the OpenB loader reads the real trace."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from jobs.models import Job, JobState
from quotas.models import QueuePolicy
from quotas.selectors import active_reservations

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from simulate import (
    _held_options,
    _least_error,
    diagnosis,
    fairness_report,
    jain,
    jain_bound,
    simulate,
)
from traces import OPENB_DIR, SyntheticParams, openb, openb_gpu, synthetic

SMALL = SyntheticParams(jobs=40, workspaces=3, seed=7, gpus=16, load=1.5)


@pytest.mark.django_db
@pytest.mark.parametrize("policy", QueuePolicy.values)
def test_a_small_replay_is_sane_under_every_policy(policy):
    trace = synthetic(SMALL)
    result = simulate(trace, policy, predictions=5)

    assert result.started == result.jobs == 40  # every job starts
    assert result.queued_seconds > 0  # the load made work queue
    assert 0 <= result.utilisation <= 1 + 1e-9
    assert all(wait >= 0 for wait in result.all_waits())
    assert 0 < result.jain <= 1 + 1e-9
    assert 0 < result.jain_windowed <= 1 + 1e-9
    assert result.preempted == 0 and result.preempted_gpu_hours == 0
    assert len(result.predictions) == 5
    # Every run held GPUs and ended once (no preemption): one release each, in time order.
    assert result.releases == sorted(result.releases)
    assert len(result.releases) == sum(1 for task in trace.tasks if task.gpu)
    assert min(result.releases) > min(result.first_starts)
    # The jobs went through the real transitions: all succeeded, nothing is held any more.
    jobs = Job.objects.filter(organization__slug=f"sim-{policy.replace('_', '-')}")
    assert set(jobs.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert not active_reservations().filter(job__in=jobs).exists()
    if policy == QueuePolicy.FIFO:
        order = sorted(range(len(trace.tasks)), key=lambda i: trace.tasks[i].arrival)
        last_start: dict[int, float] = {}
        for i in order:  # arrival order, and ids in the same order
            priority, start = trace.tasks[i].priority, result.first_starts[i]
            assert start >= last_start.get(priority, 0.0), "fifo overtook an earlier job"
            last_start[priority] = start


@pytest.mark.django_db
def test_the_diagnosis_sets_expected_overtakers_against_actual_ones():
    trace = synthetic(SMALL)
    result = simulate(trace, QueuePolicy.FAIR_SHARE, predictions=20)
    assert set(result.expected_overtakers) == set(result.predicted)
    assert all(count >= 0 for count in result.expected_overtakers.values())
    report = diagnosis(result, trace, result.predicted, 1.0)
    assert "later jobs that went first, median:" in report
    assert "the least a point prediction could miss by" in report
    # Every sampled job that waited is counted once, by whether it started before or after
    # the trace's last submission.
    waited = re.findall(r"^    (?:not )?overtaken: (\d+) jobs", report, re.M)
    split = re.findall(r"^    started (?:before|after) the trace's last submission: (\d+) jobs",
                       report, re.M)  # fmt: skip
    assert waited and split and sum(map(int, split)) == sum(map(int, waited))


@pytest.mark.django_db
def test_preemption_gives_guarantees_back_and_counts_the_work_lost():
    # At twice the load the capacity can serve, workspaces borrow what others are guaranteed.
    trace = synthetic(SyntheticParams(jobs=30, workspaces=3, seed=3, gpus=16, load=2.0))
    result = simulate(trace, QueuePolicy.FAIR_SHARE, preemption=True)

    assert result.started == result.jobs
    assert result.preempted > 0 and result.preempted_gpu_hours > 0


def test_the_least_error_for_one_release_is_the_exponentials():
    # The wait for the next event of a Poisson process is exponential: a constant c is within
    # e of it when c / (1 + e) <= X <= c / (1 - e), with probability
    # exp(-c / (1 + e)) - exp(-c / (1 - e)); the least e for which some c gets that to 1/2,
    # worked out on a fine grid, is what the draws must give.
    def best(e):
        return max(
            math.exp(-c / (1 + e)) - math.exp(-c / (1 - e))
            for c in (n / 1000 for n in range(1, 5000))
        )

    low, high = 0.01, 0.99
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (low, middle) if best(middle) >= 0.5 else (middle, high)
    assert _least_error([1] * 20, 0.5) == pytest.approx(high, abs=0.03)
    assert 0.55 < high < 0.7


def test_the_least_error_shrinks_as_a_wait_spans_more_releases():
    one, eight, many = (_least_error([k] * 10, 0.9) for k in (1, 8, 64))
    assert one > eight > many
    assert many < 0.25
    # A job that waited for no release counts as predicted exactly.
    assert _least_error([0, 0, 0, 1], 0.5) < 0.01
    assert _least_error([0, 1, 1, 1], 0.5) < _least_error([1, 1, 1], 0.5)


def test_a_workspace_holds_any_whole_subset_of_its_jobs():
    options = _held_options(frozenset({(8.0, 1), (1.0, 2)}))
    assert list(options) == [0, 1, 2, 8, 9, 10]
    assert list(_held_options(frozenset({(0.5, 3)}))) == [0, 0.5, 1, 1.5]


def test_the_bound_on_jains_index_is_reached_when_shares_can_be_equal_and_holds_them_apart():
    # Shares that can all be 1 reach 1.
    assert jain_bound([np.array([0, 0.5, 1.0]), np.array([0, 1.0, 2.0])]) == pytest.approx(1.0)
    # A workspace whose one job is 4 times its fair share holds 0 or 4, beside one that can
    # hold any share up to 1: the best pick is 4 and 1 (0.735); the bound, which only knows
    # that the shares' variance is at least their distance from their mean, is 0.79 (at a
    # mean of 3.3: 3.3² ÷ (3.3² + (0.7² + 2.3²) ÷ 2)). Above what can be had, well below 1.
    two = [np.array([0.0, 4.0]), np.arange(0, 101) / 100]
    assert jain([4.0, 1.0]) < jain_bound(two) == pytest.approx(0.7907, abs=1e-3)
    # It bounds every choice: no pick of one option each does better.
    rng = np.random.default_rng(3)
    options = [np.sort(rng.choice(np.arange(0, 60) / 10, size=4, replace=False)) for _ in range(4)]
    picks = [
        jain([float(a), float(b), float(c), float(d)])
        for a in options[0]
        for b in options[1]
        for c in options[2]
        for d in options[3]
    ]
    assert max(picks) <= jain_bound(options) + 1e-3


@pytest.mark.django_db
def test_a_replay_can_bound_jains_index_by_what_whole_jobs_allow():
    result = simulate(synthetic(SMALL), QueuePolicy.FAIR_SHARE, jain_bound=True)
    assert result.jain <= result.jain_bound + 1e-3  # the bound is maximised on a grid
    assert result.jain_bound <= 1 + 1e-9
    report = fairness_report(result, synthetic(SMALL))
    assert f"under contention {result.jain:.3f}" in report
    assert set(result.shares) <= {0, 1, 2} and result.shares
    assert simulate(synthetic(SMALL), QueuePolicy.FIFO, slug="no-bound").jain_bound is None


def test_jain_is_one_when_equal_and_one_over_n_when_one_holds_everything():
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_synthetic_traces_are_seeded():
    assert synthetic(SMALL).tasks == synthetic(SMALL).tasks
    other = synthetic(SyntheticParams(jobs=60, workspaces=3, seed=8))
    assert other.tasks != synthetic(SMALL).tasks


@pytest.mark.skipif(
    not OPENB_DIR.exists(), reason=f"the OpenB trace is not at {OPENB_DIR} (../shared is absent)"
)
def test_the_openb_loader_reads_the_real_trace():
    trace = openb(workspaces=7, capacity_scale=0.5)

    assert len(trace.tasks) == 8152 - 897  # the 897 tasks never scheduled are skipped
    assert trace.capacity["gpu"] == pytest.approx(6212 * 0.5)
    assert {task.priority for task in trace.tasks} == {9, 7, 5, 3}
    assert any(0 < task.gpu < 1 for task in trace.tasks)  # GPU-sharing tasks
    assert max(task.gpu for task in trace.tasks) == 8
    assert all(task.runtime >= 1 for task in trace.tasks)
    assert [t.arrival for t in trace.tasks] == sorted(t.arrival for t in trace.tasks)
    assert {task.workspace for task in trace.tasks} == set(range(7))
    for name in ("cpu", "memory_gb", "gpu"):
        total = sum(g[name] for g in trace.guarantees)
        assert total == pytest.approx(trace.capacity[name])
    assert openb_gpu(1, 460) == 0.46 and openb_gpu(2, 1000) == 2 and openb_gpu(0, 0) == 0


@pytest.mark.skipif(not OPENB_DIR.exists(), reason=f"the OpenB trace is not at {OPENB_DIR}")
def test_an_openb_sample_keeps_the_load():
    full, sample = openb(capacity_scale=0.01), openb(capacity_scale=0.01, jobs=1000)

    assert len(sample.tasks) == 1000
    assert sample.tasks[0] == full.tasks[0]
    assert sample.capacity["gpu"] == pytest.approx(full.capacity["gpu"] * 1000 / len(full.tasks))


@pytest.mark.django_db
def test_fair_share_preemption_preempts_for_fairness_and_the_replay_counts_it():
    from jobs.models import JobEvent

    trace = synthetic(SyntheticParams(jobs=60, workspaces=4, seed=4, gpus=16, load=2.0))
    fair = simulate(trace, QueuePolicy.FAIR_SHARE, fair_preemption=True, slug="fair")
    assert fair.started == fair.jobs
    assert fair.preempted > 0 and fair.preempted_gpu_hours > 0
    events = JobEvent.objects.filter(kind="preempted", job__organization__slug="fair")
    assert events.count() == fair.preempted
    assert events.filter(reason__endswith="which holds less than its fair share").exists()
    # Guarantee preemption alone preempts for no one's fair share, and leaves the shares further
    # from fair (seeded: the replays are deterministic).
    plain = simulate(trace, QueuePolicy.FAIR_SHARE, preemption=True, slug="plain")
    plain_events = JobEvent.objects.filter(kind="preempted", job__organization__slug="plain")
    assert plain_events.count() == plain.preempted
    assert not plain_events.filter(reason__endswith="which holds less than its fair share").exists()
    assert fair.jain > plain.jain, (fair.jain, plain.jain)

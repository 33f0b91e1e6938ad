"""Replay a workload through the real admission code, on PostgreSQL, on a simulated clock, and
measure what each queue policy makes of it.

    .venv/bin/python bench/simulate.py --trace synthetic [--jobs 2000 --workspaces 20 …]
    .venv/bin/python bench/simulate.py --trace openb [--capacity-scale 0.01 --jobs N …]
    … [--policy fair_share|all] [--preemption] [--fair-preemption] [--predictions 200] [--seed 1]
    … [--diagnose] [--jain-bound]

For each policy (``all``: every value of ``QueuePolicy``, so a policy added there is simulated
without change here) a fresh organisation is built: N workspaces with the trace's guarantees,
an ``OrgQuota`` with its capacity and the policy. The jobs are real ``Job`` rows, created in
bulk at their arrival time, and they move through the real transitions: ``admission.admit`` (the
pass a worker runs) admits them to ``launching``, then they move to ``running`` and, when their
run time is up, to ``succeeded`` (releasing their reservations). What talks to Ray or Celery is
left out: launching and following a cluster become two writes (the attempt's state and the
job's transition), launching takes no time, and the tasks the transitions send on commit go to
kombu's in-memory broker, where nothing consumes them.

Time is simulated: ``django.utils.timezone.now`` is the simulated clock in this process, so the
rows' timestamps, the balanced policy's patience and the prediction all read it. The loop goes
from event to event (the next arrival or the next end): it ends what has ended, creates what
has arrived, and runs one admission pass, as the transitions' hooks would trigger; a pass that
preempted jobs is followed by another (their return to the queue triggers one). A pass with
nothing queued is skipped: it could admit nothing.

Per policy it prints:

- utilisation while queued: GPU-time held ÷ (GPU capacity × time), over the time at least one
  job is queued;
- waits (first start − arrival): overall p50/p95, and each workspace's p50 and p95 summarised
  as min/median/max across workspaces;
- Jain's fairness index under contention: while a job is queued, each workspace's fair GPU
  allocation is the weighted max-min (water-filling) share of the capacity given its demand
  (what it holds plus what it has queued), weighted by its GPU guarantee; its normalised share
  is what it holds ÷ that; Jain = (Σx)² ÷ (n·Σx²) over the n workspaces with demand (1 when
  every one holds exactly its fair share), time-weighted over the intervals with n ≥ 2;
  "Jain 1h" is the same index of each workspace's held ÷ fair integrated over windows of
  ``--jain-window`` seconds (3,600) of contention: jobs are indivisible, so at any one instant a
  workspace whose fair share is 0.7 GPU holds 0 or a whole job; over an hour it can hold its share
  on average, and that is what a scheduler can be fair about;
- preempted GPU-hours: GPU × time run by the attempts that preemption ended (work lost);
- the prediction error: for every k-th job, ``predict_start`` at its submission (before the
  pass that follows it); its p50 wait against the actual one, |error| ÷ actual wait, median and
  p90, over the jobs that waited at least ``--min-wait`` seconds (the others are counted apart:
  a relative error of a wait near 0 means nothing);
- the replay's speed: simulated jobs ÷ wall seconds of the replay (predictions not counted).

``--diagnose`` breaks the prediction error down (overtaken or not, early or late, started before
or after the trace's last submission, and by the GPU releases each job waited for, beside the
least error any point prediction could have had);
``--jain-bound`` adds the most Jain's index could have been with the jobs present at each
moment, each whole, and each workspace's part in what was lost (docs/simulation.md).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import datetime as dt
import functools
import heapq
import itertools
import math
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
from common import percentile
from traces import OPENB_DIR, SyntheticParams, Trace, openb, synthetic

from quotas.fairness import fair_allocation

EPOCH = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)  # simulated second 0
# SyntheticParams with a flag of their own (the others have theirs above).
SYNTHETIC_FLAGS = [
    f.name
    for f in dataclasses.fields(SyntheticParams)
    if f.name not in ("jobs", "workspaces", "seed", "guaranteed", "gpu_sizes", "priorities")
]
MAX_PASSES_PER_EVENT = 50  # passes that preempt trigger another; a bound, never reached so far


# --- the organisation -----------------------------------------------------------------------


@dataclasses.dataclass
class World:
    org_id: int
    owner_id: int
    workspace_ids: list[int]
    versions: dict[str, int]  # template name → version id


def build(trace: Trace, policy: str, *, preemption: bool, slug: str, fair: bool = False) -> World:
    """An organisation for one replay: its quota, the workspaces with their guarantees, and a
    template (one version) for each template the trace names. Workspaces launch on a target
    that is not this host, so only the organisation's capacity binds."""
    from audit.context import Actor
    from jobs.models import JobTemplate, JobTemplateVersion
    from quotas.models import OrgQuota, WorkspaceQuota
    from workspaces import services
    from workspaces.models import Workspace

    system = Actor.system("simulate")
    org, owner = services.org_create(actor=system, slug=slug, name="", owner_email=f"o@{slug}.t")
    OrgQuota.objects.create(
        organization=org,
        policy=policy,
        preemption=preemption or fair,
        fair_share_preemption=fair,
        **trace.capacity,
    )
    # A victim leaves at once: the replay has no driver to give a grace period to. The
    # organisation exists from the trace's start (the simulated clock's 0).
    type(org).objects.filter(pk=org.pk).update(preemption_grace_seconds=0, created_at=EPOCH)
    workspaces = []
    for index, guarantee in enumerate(trace.guarantees):
        ws = services.workspace_create(actor=system, organization=org, slug=f"w{index}")
        WorkspaceQuota.objects.create(
            workspace=ws, **{f"guaranteed_{name}": amount for name, amount in guarantee.items()}
        )
        workspaces.append(ws)
    Workspace.objects.filter(organization=org).update(compute_target="cluster")
    names = sorted({(task.workspace, task.template) for task in trace.tasks})
    templates = JobTemplate.objects.bulk_create(
        JobTemplate(organization=org, workspace=workspaces[ws], name=name[:100], latest_version=1)
        for ws, name in names
    )
    versions = JobTemplateVersion.objects.bulk_create(
        JobTemplateVersion(template=template, version=1, spec={}) for template in templates
    )
    return World(
        org.pk,
        owner.pk,
        [ws.pk for ws in workspaces],
        {name: version.pk for (_, name), version in zip(names, versions, strict=True)},
    )


class Clock:
    """The simulated present, in seconds from :data:`EPOCH`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.seconds)


@contextmanager
def simulated(clock: Clock) -> Iterator[None]:
    from django.utils import timezone

    with mock.patch.object(timezone, "now", clock.now):
        yield


# --- the replay -----------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    policy: str
    jobs: int
    started: int
    waits: dict[int, list[float]]  # workspace index → waits of its jobs (seconds)
    first_starts: list[float | None]  # per task, seconds; None when it never started
    utilisation: float  # while queued
    queued_seconds: float  # how long at least one job was queued
    jain: float
    contended_seconds: float  # the time Jain is averaged over
    jain_windowed: float  # over windows of contention (held and fair integrated per window)
    jain_bound: float | None  # the most any allocation of the jobs present could have had
    # workspace index → (seconds contended, ∫x, ∫(x − mean x)², seconds at x = 0, ∫fair) under
    # contention, x being held ÷ fair (with jain_bound only)
    shares: dict[int, list[float]]
    preempted: int  # attempts ended by preemption
    preempted_gpu_hours: float
    predictions: list[tuple[float, float | None]]  # (actual wait, predicted p50 wait) seconds
    predicted: dict[int, float | None]  # task index → predicted p50 wait (seconds)
    # task index → expected submissions the prediction's p50 replay admitted before it
    expected_overtakers: dict[int, int]
    prediction_seconds: float  # wall time spent predicting
    releases: list[float]  # seconds: when a run that held GPUs ended or was preempted, in order
    wall_seconds: float  # wall time of the replay, predictions excluded
    passes: int

    def all_waits(self) -> list[float]:
        return [wait for waits in self.waits.values() for wait in waits]


@functools.lru_cache(maxsize=1 << 16)
def _held_options(jobs: frozenset) -> np.ndarray:
    """The GPUs a workspace could hold with the jobs it has (``jobs``: (size, count) pairs of
    the ones running or queued), each job whole: the sum of every subset of their sizes,
    sorted, in hundredths of a GPU turned back into GPUs."""
    reachable = 1  # bit s: a subset adds up to s hundredths
    for size, count in jobs:
        step = round(size * 100)
        for _ in range(count):
            reachable |= reachable << step
    width = (reachable.bit_length() + 7) // 8
    bits = np.unpackbits(
        np.frombuffer(reachable.to_bytes(width, "little"), dtype=np.uint8), bitorder="little"
    )
    return np.flatnonzero(bits) / 100


JAIN_GRID = np.arange(1, 4001) / 1000  # the means tried: 0.001 to 4


def jain_bound(options: list[np.ndarray]) -> float:
    """The most Jain's index can be when workspace w's share x_w must be one of ``options[w]``
    (sorted): whatever shares with mean m are chosen, their variance is at least the mean over
    the workspaces of the squared distance from m to the nearest of their options, and the
    index is m² ÷ (m² + variance): at most m² ÷ (m² + that). The maximum over m is taken on a
    grid (0.001 to 4, then 1,000 steps up to the largest option). The capacity is not checked:
    this bounds every allocation, it does not make one."""
    top = max(float(values[-1]) for values in options)
    grid = JAIN_GRID if top <= 4 else np.concatenate([JAIN_GRID, np.linspace(4, top, 1000)])
    spread = np.zeros_like(grid)
    for values in options:
        at = np.searchsorted(values, grid)
        below = values[np.clip(at - 1, 0, len(values) - 1)]
        above = values[np.clip(at, 0, len(values) - 1)]
        spread += np.minimum(np.abs(grid - below), np.abs(above - grid)) ** 2
    spread /= len(options)
    return float(np.max(grid**2 / (grid**2 + spread)))


def jain(shares: list[float]) -> float:
    """Jain's index of ``shares``: 1 when all are equal, 1/n when one holds everything."""
    total, squares = sum(shares), sum(x * x for x in shares)
    return 1.0 if squares == 0 else total * total / (len(shares) * squares)


class Replay:
    """One policy's replay of a trace; :meth:`run` returns its :class:`Result`."""

    def __init__(
        self,
        trace: Trace,
        world: World,
        policy: str,
        *,
        preemption: bool,
        predictions: int = 0,
        jain_window: float = 3600.0,
        jain_bound: bool = False,
    ):
        self.trace, self.world, self.policy = trace, world, policy
        self.preemption = preemption
        self.clock = Clock()
        n = len(trace.tasks)
        stride = max(1, n // predictions) if predictions else 0
        self.sampled = set(range(0, n, stride)[:predictions]) if stride else set()
        self.job_ids: list[int | None] = [None] * n
        self.index: dict[int, int] = {}  # job id → task index
        self.first_start: list[float | None] = [None] * n
        self.attempt = [0] * n  # bumped at each start: an end event of an older one is stale
        self.started_at = [0.0] * n
        self.queued: set[int] = set()  # task indices
        self.running: set[int] = set()
        self.ends: list[tuple[float, int, int]] = []  # (end, task index, attempt)
        self.releases: list[float] = []  # when GPUs were freed (Result.releases)
        self.held = defaultdict(float)  # workspace index → GPUs held
        self.waiting_gpu = defaultdict(float)  # workspace index → GPUs queued
        self.predicted: dict[int, float | None] = {}
        self.expected_overtakers: dict[int, int] = {}
        self.prediction_seconds = 0.0
        self.passes = self.preempted = 0
        self.preempted_gpu_seconds = 0.0
        self.last_event_id = 0
        self.queued_time = self.used_gpu_time = 0.0
        self.contended_time = self.jain_time = 0.0
        self.jain_window = jain_window
        self.window: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])  # ws → ∫held, ∫fair
        self.window_span = self.windowed_time = self.windowed_jain_time = 0.0
        self.weights = {ws: g["gpu"] for ws, g in enumerate(trace.guarantees)}
        # For the bound on Jain's index: each workspace's jobs between arrival and end (GPUs).
        self.present: dict[int, Counter] | None = defaultdict(Counter) if jain_bound else None
        self.bound_time = self.bound_seconds = 0.0
        self.shares: dict[int, list[float]] = defaultdict(lambda: [0.0] * 5)

    # --- the loop

    def run(self) -> Result:
        tasks = self.trace.tasks
        arrived, last = 0, tasks[0].arrival if tasks else 0.0
        started = time.perf_counter()
        with simulated(self.clock):
            while arrived < len(tasks) or self.ends:
                now = min(
                    tasks[arrived].arrival if arrived < len(tasks) else math.inf,
                    self.ends[0][0] if self.ends else math.inf,
                )
                self._account(last, now)
                self.clock.seconds = last = now
                self._end_due(now)
                new = []
                while arrived < len(tasks) and tasks[arrived].arrival <= now:
                    new.append(arrived)
                    arrived += 1
                if new:
                    self._arrive(new)
                if self.queued:
                    self._admit()
        self._close_window()
        wall = time.perf_counter() - started - self.prediction_seconds - self.bound_seconds
        waits: dict[int, list[float]] = defaultdict(list)
        for index, task in enumerate(tasks):
            if self.first_start[index] is not None:
                waits[task.workspace].append(self.first_start[index] - task.arrival)
        predictions = [
            (self.first_start[index] - tasks[index].arrival, predicted)
            for index, predicted in self.predicted.items()
            if self.first_start[index] is not None
        ]
        return Result(
            policy=self.policy,
            jobs=len(tasks),
            started=sum(start is not None for start in self.first_start),
            waits=dict(waits),
            first_starts=list(self.first_start),
            utilisation=(
                self.used_gpu_time / (self.trace.capacity["gpu"] * self.queued_time)
                if self.queued_time
                else 0.0
            ),
            queued_seconds=self.queued_time,
            jain=self.jain_time / self.contended_time if self.contended_time else 1.0,
            contended_seconds=self.contended_time,
            jain_windowed=(
                self.windowed_jain_time / self.windowed_time if self.windowed_time else 1.0
            ),
            jain_bound=None if self.present is None else self._mean_bound(),
            preempted=self.preempted,
            preempted_gpu_hours=self.preempted_gpu_seconds / 3600,
            predictions=predictions,
            predicted=dict(self.predicted),
            expected_overtakers=dict(self.expected_overtakers),
            prediction_seconds=self.prediction_seconds,
            releases=self.releases,
            shares=dict(self.shares),
            wall_seconds=wall,
            passes=self.passes,
        )

    def _mean_bound(self) -> float:
        """The bound on Jain's index, time-weighted like the index (1 with no contention)."""
        return self.bound_time / self.contended_time if self.contended_time else 1.0

    def _account(self, since: float, until: float) -> None:
        """Count the interval [since, until), in which nothing changed, into the metrics."""
        span = until - since
        if span <= 0 or not self.queued:
            return
        self.queued_time += span
        self.used_gpu_time += sum(self.held.values()) * span
        demand = {
            ws: self.held[ws] + self.waiting_gpu[ws]
            for ws in set(self.held) | set(self.waiting_gpu)
            if self.held[ws] + self.waiting_gpu[ws] > 1e-9
        }
        fair = fair_allocation(demand, self.weights, self.trace.capacity["gpu"])
        if len(fair) >= 2:
            self.contended_time += span
            shares = {ws: self.held[ws] / fair[ws] for ws in fair}
            self.jain_time += jain(list(shares.values())) * span
            if self.present is not None:
                started = time.perf_counter()
                options = [
                    _held_options(frozenset(self.present[ws].items())) / fair[ws] for ws in fair
                ]
                self.bound_time += jain_bound(options) * span
                mean = statistics.fmean(shares.values())
                for ws, x in shares.items():
                    for k, value in enumerate((1, x, (x - mean) ** 2, x == 0, fair[ws])):
                        self.shares[ws][k] += value * span
                self.bound_seconds += time.perf_counter() - started
            for ws, share in fair.items():
                self.window[ws][0] += self.held[ws] * span
                self.window[ws][1] += share * span
            self.window_span += span
            if self.window_span >= self.jain_window:
                self._close_window()

    def _close_window(self) -> None:
        """Count the window of contention that ends now into the windowed Jain index."""
        shares = [held / fair for held, fair in self.window.values() if fair > 1e-9]
        if len(shares) >= 2:
            self.windowed_jain_time += jain(shares) * self.window_span
            self.windowed_time += self.window_span
        self.window.clear()
        self.window_span = 0.0

    # --- the transitions

    def _arrive(self, new: list[int]) -> None:
        """Submit the tasks that arrived now: queued Job rows, in bulk."""
        from jobs.models import Job, JobState

        tasks, world, now = self.trace.tasks, self.world, self.clock.now()
        rows = Job.objects.bulk_create(
            Job(
                organization_id=world.org_id,
                workspace_id=world.workspace_ids[tasks[i].workspace],
                template_version_id=world.versions[tasks[i].template],
                name=tasks[i].name,
                state=JobState.QUEUED,
                spec={
                    "max_runtime_seconds": tasks[i].max_runtime,
                    "max_retries": 0,
                    "priority": tasks[i].priority,
                },
                requested_cpu=tasks[i].cpu,
                requested_memory_gb=tasks[i].memory_gb,
                requested_gpu=tasks[i].gpu,
                requested_disk_gb=0,
                priority=tasks[i].priority,
                submitted_by_id=world.owner_id,
                queued_at=now,
            )
            for i in new
        )
        for i, row in zip(new, rows, strict=True):
            if self.present is not None and self.trace.tasks[i].gpu:
                self.present[self.trace.tasks[i].workspace][self.trace.tasks[i].gpu] += 1
            self.job_ids[i] = row.pk
            self.index[row.pk] = i
            self._enqueue(i)
        for i, row in zip(new, rows, strict=True):
            if i in self.sampled:
                self._predict(i, row)

    def _predict(self, i: int, job) -> None:
        from jobs.prediction import predict_start

        started = time.perf_counter()
        prediction = predict_start(job, now=self.clock.now())
        self.prediction_seconds += time.perf_counter() - started
        self.predicted[i] = (
            None if prediction.p50 is None else (prediction.p50 - job.queued_at).total_seconds()
        )
        self.expected_overtakers[i] = prediction.overtakers

    def _enqueue(self, i: int) -> None:
        self.queued.add(i)
        self.waiting_gpu[self.trace.tasks[i].workspace] += self.trace.tasks[i].gpu

    def _admit(self) -> None:
        """Admission passes, as the workers run them, until one preempts nothing."""
        from jobs import admission

        for _ in range(MAX_PASSES_PER_EVENT):
            self.passes += 1
            admitted = admission.admit(self.world.org_id)
            preempted = self.preemption and self._preempted()
            if admitted:
                self._start([self.index[pk] for pk in admitted])
            if not preempted or not self.queued:
                return

    def _start(self, started: list[int]) -> None:
        """What a launch and its follower write when the cluster is up: the attempt and the
        job are running (no launch time is simulated)."""
        from django.db import transaction

        from jobs.attempts import SYSTEM
        from jobs.models import AttemptState, Job, JobAttempt, JobState
        from jobs.state import transition

        now, tasks = self.clock.seconds, self.trace.tasks
        ids = [self.job_ids[i] for i in started]
        with transaction.atomic():
            JobAttempt.objects.filter(job_id__in=ids, state=AttemptState.LAUNCHING).update(
                state=AttemptState.RUNNING, running_at=self.clock.now()
            )
            transition([Job(pk=pk) for pk in ids], JobState.RUNNING, actor=SYSTEM)
        for i in started:
            task = tasks[i]
            self.queued.discard(i)
            self.waiting_gpu[task.workspace] -= task.gpu
            self.held[task.workspace] += task.gpu
            self.running.add(i)
            self.attempt[i] += 1
            self.started_at[i] = now
            if self.first_start[i] is None:
                self.first_start[i] = now
            heapq.heappush(self.ends, (now + task.runtime, i, self.attempt[i]))

    def _end_due(self, now: float) -> None:
        """End the runs whose time is up: what the follower writes when Ray says succeeded (the
        attempt ends, the job's transition releases its reservation)."""
        from django.db import transaction

        from jobs.attempts import SYSTEM
        from jobs.models import ATTEMPT_ACTIVE, AttemptState, Job, JobAttempt, JobState
        from jobs.state import transition

        due = []
        while self.ends and self.ends[0][0] <= now:
            _, i, attempt = heapq.heappop(self.ends)
            if i in self.running and attempt == self.attempt[i]:
                due.append(i)
        if not due:
            return
        ids = [self.job_ids[i] for i in due]
        with transaction.atomic():
            JobAttempt.objects.filter(job_id__in=ids, state__in=ATTEMPT_ACTIVE).update(
                state=AttemptState.SUCCEEDED, finished_at=self.clock.now()
            )
            transition([Job(pk=pk) for pk in ids], JobState.SUCCEEDED, actor=SYSTEM)
        for i in due:
            self.running.discard(i)
            self.held[self.trace.tasks[i].workspace] -= self.trace.tasks[i].gpu
            if self.trace.tasks[i].gpu:
                self.releases.append(now)
                if self.present is not None:
                    task = self.trace.tasks[i]
                    present, size = self.present[task.workspace], task.gpu
                    present[size] -= 1
                    if not present[size]:
                        del present[size]

    def _preempted(self) -> bool:
        """Account the runs the last pass preempted (their jobs are queued again)."""
        from jobs.models import JobEvent

        events = JobEvent.objects.filter(
            pk__gt=self.last_event_id, kind="preempted", job__organization_id=self.world.org_id
        ).values_list("pk", "job_id")
        found = False
        for pk, job_id in events:
            self.last_event_id = max(self.last_event_id, pk)
            i = self.index[job_id]
            if i not in self.running:
                continue
            task, found = self.trace.tasks[i], True
            self.running.discard(i)
            self.held[task.workspace] -= task.gpu
            self.preempted += 1
            self.preempted_gpu_seconds += task.gpu * (self.clock.seconds - self.started_at[i])
            if task.gpu:
                self.releases.append(self.clock.seconds)
            self._enqueue(i)
        return found


def simulate(
    trace: Trace,
    policy: str,
    *,
    preemption: bool = False,
    fair_preemption: bool = False,
    fair_gain: float | None = None,
    predictions: int = 0,
    slug: str = "",
    jain_window: float = 3600.0,
    jain_bound: bool = False,
) -> Result:
    """Replay ``trace`` under ``policy`` in a new organisation of the configured database."""
    from jobs.models import JobEvent

    world = build(
        trace,
        policy,
        preemption=preemption,
        fair=fair_preemption,
        slug=slug or f"sim-{policy.replace('_', '-')}",
    )
    replay = Replay(
        trace,
        world,
        policy,
        preemption=preemption or fair_preemption,
        predictions=predictions,
        jain_window=jain_window,
        jain_bound=jain_bound,
    )
    replay.last_event_id = (
        JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    )
    if fair_gain is None:
        return replay.run()
    with mock.patch("jobs.preemption.FAIR_GAIN", fair_gain):
        return replay.run()


# --- the report -----------------------------------------------------------------------------


def summary(result: Result, min_wait: float) -> dict[str, str]:
    """The figures of one replay, as the table prints them."""
    everyone = sorted(result.all_waits())
    p50s = sorted(percentile(w, 50) for w in result.waits.values())
    p95s = sorted(percentile(w, 95) for w in result.waits.values())
    errors = sorted(
        abs(predicted - actual) / actual
        for actual, predicted in result.predictions
        if predicted is not None and actual >= min_wait
    )
    short = [(a, p) for a, p in result.predictions if a < min_wait]
    unknown = sum(p is None for _, p in result.predictions)

    def span(values: list[float]) -> str:
        return "/".join(_duration(v) for v in (values[0], statistics.median(values), values[-1]))

    return {
        "policy": result.policy,
        "started": f"{result.started}/{result.jobs}",
        "util while queued": f"{result.utilisation:.1%}",
        "wait p50": _duration(percentile(everyone, 50)) if everyone else "-",
        "wait p95": _duration(percentile(everyone, 95)) if everyone else "-",
        "ws p50 min/med/max": span(p50s) if p50s else "-",
        "ws p95 min/med/max": span(p95s) if p95s else "-",
        "Jain": f"{result.jain:.3f}",
        "Jain 1h": f"{result.jain_windowed:.3f}",
        "preempted GPU-h": f"{result.preempted_gpu_hours:.1f} ({result.preempted})",
        "pred err p50": f"{percentile(errors, 50):.1%}" if errors else "-",
        "pred err p90": f"{percentile(errors, 90):.1%}" if errors else "-",
        "pred n": f"{len(errors)}+{len(short)}<{min_wait:g}s" + (f",{unknown}?" if unknown else ""),
        "jobs/s": f"{result.jobs / result.wall_seconds:.0f}",
    }


def _duration(seconds: float) -> str:
    if seconds < 100:
        return f"{seconds:.0f}s"
    if seconds < 6000:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def print_table(rows: list[dict[str, str]]) -> None:
    """A Markdown table (docs/simulation.md holds them as printed)."""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    print("| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |")
    print("|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|")
    for row in rows:
        print("| " + " | ".join(row[c].ljust(widths[c]) for c in columns) + " |")


def fairness_report(result: Result, trace: Trace) -> str:
    """The bound on Jain's index, and where the index is lost: each workspace's mean share
    x = held ÷ fair while it had demand under contention, how often it held nothing, and its
    part of the shares' variance (Jain = mean² ÷ (mean² + variance), time-weighted)."""
    lines = [
        f"  {result.policy}: Jain's index under contention {result.jain:.3f}; with the jobs "
        "present at each moment, each whole, no allocation could have had more than "
        f"{result.jain_bound:.3f}",
        "    workspace: guarantee GPUs, mean fair GPUs, mean x, time at x = 0, "
        "part of the variance (time with demand)",
    ]
    for ws, (seconds, x, spread, idle, fair) in sorted(
        result.shares.items(), key=lambda item: -item[1][2]
    ):
        lines.append(
            f"    {ws:>3}: {trace.guarantees[ws]['gpu']:6.2f} {fair / seconds:6.2f} "
            f"{x / seconds:5.2f} {idle / seconds:4.0%} "
            f"{spread / result.contended_seconds:6.3f} ({seconds / result.contended_seconds:.0%})"
        )
    return "\n".join(lines)


def short_prediction_report(result: Result, min_wait: float) -> str:
    """How the predictions of jobs that barely waited fared (absolute error)."""
    short = [(a, p) for a, p in result.predictions if a < min_wait and p is not None]
    if not short:
        return ""
    exact = sum(abs(p - a) < 1 for a, p in short)
    errors = sorted(abs(p - a) for a, p in short)
    return (
        f"  {result.policy}: {len(short)} sampled jobs waited < {min_wait:g} s; "
        f"{exact} predicted within 1 s, abs error p50 {_duration(percentile(errors, 50))}, "
        f"p90 {_duration(percentile(errors, 90))}; "
        f"{result.prediction_seconds / max(1, len(result.predictions)) * 1000:.0f} ms "
        "per prediction"
    )


def diagnosis(result: Result, trace: Trace, predicted: dict[int, float | None], min_wait: float):
    """Where the prediction error comes from: the sampled jobs that waited ``min_wait`` or more,
    split by whether jobs submitted after them started before them (the replay cannot know
    those unless it models arrivals) and by the sign of the error (early: predicted to start
    sooner than it did), with how many jobs submitted later the replay let go first (expected
    submissions) against how many did."""
    tasks, starts = trace.tasks, result.first_starts
    groups: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, list[tuple[int, int]]] = defaultdict(list)  # (expected, actual)
    by_releases: dict[int, list[float]] = defaultdict(list)  # GPU releases waited → |error|
    releases = result.releases
    # A trace ends: its last jobs start while nobody submits any more, which no prediction
    # made from the submissions so far expects (a live organisation goes on submitting).
    last_arrival = max(task.arrival for task in tasks)
    by_arrivals: dict[bool, list[float]] = defaultdict(list)  # started after the last? → |error|
    for i, guess in predicted.items():
        if guess is None or starts[i] is None:
            continue
        actual = starts[i] - tasks[i].arrival
        if actual < min_wait:
            continue
        overtakers = sum(
            1
            for j in range(i + 1, len(tasks))
            if tasks[j].arrival > tasks[i].arrival
            and starts[j] is not None
            and starts[j] < starts[i]
        )
        error = (guess - actual) / actual
        side = "early" if error < 0 else "late"
        kind = "overtaken" if overtakers else "not overtaken"
        groups[f"{kind}, {side}"].append(error)
        groups[kind].append(abs(error))
        counts[f"{kind}, {side}"].append((result.expected_overtakers.get(i, 0), overtakers))
        waited_for = bisect.bisect_right(releases, starts[i]) - bisect.bisect_right(
            releases, tasks[i].arrival
        )
        by_releases[waited_for].append(abs(error))
        by_arrivals[starts[i] > last_arrival].append(abs(error))
    lines = []
    for name in ("not overtaken", "overtaken"):
        errors = sorted(groups.get(name, []))
        if errors:
            lines.append(
                f"    {name}: {len(errors)} jobs, |error| p50 {percentile(errors, 50):.0%}, "
                f"p90 {percentile(errors, 90):.0%}"
            )
        for side in ("early", "late"):
            signed = sorted(groups.get(f"{name}, {side}", []))
            if signed:
                expected, actual = zip(*counts[f"{name}, {side}"], strict=True)
                lines.append(
                    f"      {side}: {len(signed)} jobs, error p50 {percentile(signed, 50):+.0%}; "
                    f"later jobs that went first, median: {statistics.median(expected):g} "
                    f"expected, {statistics.median(actual):g} did"
                )
    for drained in (False, True):
        errors = sorted(by_arrivals.get(drained, []))
        if errors:
            lines.append(
                f"    started {'after' if drained else 'before'} the trace's last submission: "
                f"{len(errors)} jobs, |error| p50 "
                f"{percentile(errors, 50):.0%}, p90 {percentile(errors, 90):.0%}"
            )
    lines.extend(_release_floor(by_releases, releases))
    return "\n".join([f"  {result.policy}: where the error comes from", *lines])


RELEASE_BUCKETS = ((0, 0), (1, 1), (2, 3), (4, 9), (10, 31), (32, math.inf))
FLOOR_DRAWS = 1000


def _release_floor(errors: dict[int, list[float]], releases: list[float]) -> list[str]:
    """The error by how many GPU releases (runs ending or preempted) a job waited for
    (``errors``: that count → the |error| of each such job), and the least error any point
    prediction could have had on these jobs: were releases a Poisson
    process (many running jobs of unrelated lengths), the wait for the k-th release is
    Gamma(k)-distributed, and even a prediction that knew each job's k and the release rate
    misses by at least what the best constants for those distributions do
    (:func:`_least_error`). The gaps between releases say how close to Poisson they are: their
    coefficient of variation is 1 for a Poisson process, above 1 when releases bunch up."""
    ks = [k for k, found in errors.items() for _ in found]
    if not ks:
        return []
    parts = []
    for low, high in RELEASE_BUCKETS:
        found = sorted(e for k, es in errors.items() if low <= k <= high for e in es)
        if found:
            name = str(low) if low == high else f"{low}+" if high == math.inf else f"{low}-{high}"
            parts.append(
                f"{name}: {len(found)} jobs, p50 {percentile(found, 50):.0%}, "
                f"p90 {percentile(found, 90):.0%}"
            )
    gaps = [later - earlier for earlier, later in itertools.pairwise(releases)]
    spread = statistics.pstdev(gaps) / statistics.fmean(gaps) if len(gaps) > 1 else math.nan
    return [
        "    |error| by the GPU releases a job waited for: " + "; ".join(parts),
        f"    gaps between GPU releases: {len(gaps)}, coefficient of variation {spread:.2f}",
        "    the least a point prediction could miss by, releases being a Poisson process "
        f"(knowing each job's count and their rate): p50 {_least_error(ks, 0.5):.0%}, "
        f"p90 {_least_error(ks, 0.9):.0%} ({sum(1 for k in ks if not k)} jobs "
        "that waited for no release count as exact)",
    ]


def _least_error(ks: list[int], q: float) -> float:
    """The least e such that a point prediction of each job's wait, knowing only that it is
    the time to its k-th release of a Poisson process, could be within e of the actual wait
    for a fraction ``q`` of the jobs: each job's best constant for that e covers the share of
    its Gamma(k) draws it covers (:func:`_gamma_errors`), and e is found by bisection."""

    def covered(e: float) -> float:
        return sum(
            max(bisect.bisect_right(errors, e) for errors in _gamma_errors(k)) / FLOOR_DRAWS
            if k
            else 1.0
            for k in ks
        )

    low, high = 0.0, 100.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (low, middle) if covered(middle) >= q * len(ks) else (middle, high)
    return high


@functools.cache
def _gamma_errors(k: int) -> list[list[float]]:
    """For each candidate constant c (0.02k to 3k), the sorted |c − x| ÷ x over fixed-seed
    draws x of the time to the k-th event of a Poisson process of rate 1 (Gamma(k, 1))."""
    rng = random.Random(k)
    draws = [rng.gammavariate(k, 1.0) for _ in range(FLOOR_DRAWS)]
    return [sorted(abs(c - x) / x for x in draws) for c in (k * n / 50 for n in range(1, 151))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = SyntheticParams()
    parser.add_argument("--trace", choices=("synthetic", "openb"), default="synthetic")
    parser.add_argument("--policy", default="all", help="a queue policy, or all")
    parser.add_argument("--workspaces", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=None, help="synthetic: 2000; openb: all")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--database", default="manta_bench_simulate", help="dropped and made anew")
    parser.add_argument("--preemption", action="store_true", help="the org preempts borrowers")
    parser.add_argument(
        "--fair-preemption",
        action="store_true",
        help="fair_share: also preempt for workspaces below their fair allocation",
    )
    parser.add_argument(
        "--fair-gain",
        type=float,
        default=None,
        help="the least fall in Σ (held ÷ fair − 1)² a fair-share preemption must bring "
        "(default: jobs.preemption.FAIR_GAIN)",
    )
    parser.add_argument(
        "--predictions", type=int, default=200, help="jobs whose start is predicted"
    )
    parser.add_argument("--diagnose", action="store_true", help="break the prediction error down")
    parser.add_argument("--min-wait", type=float, default=60, help="seconds; see the docstring")
    parser.add_argument(
        "--jain-window", type=float, default=3600, help="seconds of contention per window"
    )
    parser.add_argument(
        "--jain-bound",
        action="store_true",
        help="also the most Jain's index could have been with the jobs present, each whole",
    )
    parser.add_argument("--guaranteed", type=float, default=defaults.guaranteed,
                        help="Σ guarantees ÷ capacity")  # fmt: skip
    openb_args = parser.add_argument_group("openb")
    openb_args.add_argument("--openb-dir", default=str(OPENB_DIR))
    openb_args.add_argument("--capacity-scale", type=float, default=0.01)
    synth = parser.add_argument_group("synthetic (see SyntheticParams in bench/traces.py)")
    for name in SYNTHETIC_FLAGS:
        default = getattr(defaults, name)
        synth.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    synth.add_argument("--gpu-sizes", default="1,2,4,8")
    synth.add_argument("--priorities", default="3:0.1,5:0.8,7:0.1", help="level:weight,…")
    args = parser.parse_args()

    from common import configure

    configure(
        args.database,
        CELERY_BROKER_URL="memory://",
        LOG_LEVEL="ERROR",
        MANTA_LOCAL_CAPACITY="cpu=1000000,memory_gb=1000000,gpu=1000000",
    )
    from quotas.models import QueuePolicy

    if args.trace == "synthetic":
        params = SyntheticParams(
            jobs=args.jobs or defaults.jobs,
            workspaces=args.workspaces,
            seed=args.seed,
            guaranteed=args.guaranteed,
            gpu_sizes=tuple(int(size) for size in args.gpu_sizes.split(",")),
            priorities=tuple(
                (int(level), float(weight))
                for level, weight in (item.split(":") for item in args.priorities.split(","))
            ),
            **{name: getattr(args, name) for name in SYNTHETIC_FLAGS},
        )
        trace = synthetic(params)
    else:
        from pathlib import Path

        trace = openb(
            Path(args.openb_dir),
            workspaces=args.workspaces,
            jobs=args.jobs,
            capacity_scale=args.capacity_scale,
            guaranteed=args.guaranteed,
        )
    policies = list(QueuePolicy.values) if args.policy == "all" else [args.policy]
    preempting = ", preemption on" if args.preemption else ""
    if args.fair_preemption:
        preempting = ", preemption on (and for fair shares)"
    print(trace.description + preempting)
    rows, results = [], []
    for policy in policies:
        result = simulate(
            trace,
            policy,
            preemption=args.preemption,
            fair_preemption=args.fair_preemption,
            fair_gain=args.fair_gain,
            predictions=args.predictions,
            jain_window=args.jain_window,
            jain_bound=args.jain_bound,
        )
        results.append(result)
        rows.append(summary(result, args.min_wait))
        print(
            f"  {policy}: {result.jobs} jobs in {result.wall_seconds:.1f} s "
            f"({result.jobs / result.wall_seconds:.0f} jobs/s, {result.passes} passes), "
            f"queued {result.queued_seconds / 3600:.1f} h of simulated time, "
            f"contended {result.contended_seconds / 3600:.1f} h",
            flush=True,
        )
    print()
    print_table(rows)
    print()
    for result in results:
        line = short_prediction_report(result, args.min_wait)
        if line:
            print(line)
    for result in results:
        if result.jain_bound is not None:
            print(fairness_report(result, trace))
    if args.diagnose:
        for result in results:
            print(diagnosis(result, trace, result.predicted, args.min_wait))


if __name__ == "__main__":
    main()

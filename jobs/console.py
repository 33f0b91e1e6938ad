"""What the org admins' console (jobs/admin.py) shows of an organisation: capacity and each
workspace's guaranteed / limit / in use, its queue, pending approvals and GPU-hours against
budget, and the last days of usage and queue length as series for a server-rendered chart.

An overview costs a fixed number of queries whatever the number of jobs, attempts or
workspaces (tests/jobs/test_console.py counts them). The history is not stored anywhere: it is
rebuilt backwards from now, from aggregates per hour —

- in use (CPU, GPU) from the reservations admission writes: each adds its amount in the hour it
  was made and takes it away in the hour it was released; the level an hour ago is the level now
  less what changed since;
- queue length from the jobs' timelines (JobEvent): an event into ``queued`` adds one, an event
  out of it takes one away; the level now is the count of queued jobs.

Both are sums grouped by hour in the database (at most 24 × days rows each), so a week of history
over a million jobs reads a few hundred rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from typing import Any

from django.db.models import Case, Count, F, IntegerField, Q, Sum, Value, When
from django.db.models.functions import TruncHour
from django.utils import timezone

from quotas.ledger import month_start
from quotas.models import OrgQuota, Reservation, WorkspaceQuota
from quotas.selectors import quota_tree

from .models import Job, JobAttempt, JobEvent, JobState

SHOWN = ("cpu", "memory_gb", "gpu")  # the resources the bars show (disk is in the quota pages)
HISTORY_DAYS = 7
WAITING = (JobState.PENDING_APPROVAL, JobState.QUEUED)
ACTIVE = (JobState.LAUNCHING, JobState.RUNNING, JobState.PREEMPTING)


@dataclasses.dataclass
class Bar:
    """One resource of one workspace, in the units of the resource and as percentages of the
    bar's scale (the org's capacity, else the largest number on the row)."""

    resource: str
    guaranteed: float
    limit: float | None
    in_use: float
    scale: float

    def _pct(self, value: float | None) -> float:
        if value is None or not self.scale:
            return 0.0
        return round(min(100.0, value / self.scale * 100), 2)

    @property
    def guaranteed_pct(self) -> float:
        return self._pct(self.guaranteed)

    @property
    def limit_pct(self) -> float:
        return self._pct(self.limit) if self.limit is not None else 100.0

    @property
    def in_use_pct(self) -> float:
        return self._pct(self.in_use)

    @property
    def borrowing(self) -> bool:
        return self.in_use > self.guaranteed


@dataclasses.dataclass
class Chart:
    """A series of samples drawn as a polyline in a ``width`` × ``height`` box (SVG units)."""

    title: str
    unit: str
    samples: list[float]
    start: dt.datetime
    width: int = 600
    height: int = 120

    @property
    def peak(self) -> float:
        return max(self.samples, default=0.0)

    @property
    def latest(self) -> float:
        return self.samples[-1] if self.samples else 0.0

    @property
    def points(self) -> str:
        """The polyline's points: numbers only (nothing of a tenant's reaches the drawing)."""
        if not self.samples:
            return ""
        top = self.peak or 1.0
        step = self.width / max(1, len(self.samples) - 1)
        return " ".join(
            f"{i * step:.1f},{self.height - value / top * (self.height - 4):.1f}"
            for i, value in enumerate(self.samples)
        )

    @property
    def area(self) -> str:
        """The polygon under the line, closed along the bottom edge."""
        if not self.samples:
            return ""
        return f"0,{self.height} {self.points} {self.width},{self.height}"

    @property
    def day_marks(self) -> list[dict[str, Any]]:
        """A vertical mark and a label at each midnight inside the window."""
        hours = len(self.samples) - 1
        if hours <= 0:
            return []
        marks = []
        first = (self.start + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0)
        at = first
        while at <= self.start + dt.timedelta(hours=hours):
            offset = (at - self.start).total_seconds() / 3600
            marks.append(
                {"x": round(offset / hours * self.width, 1), "label": at.strftime("%d %b")}
            )
            at += dt.timedelta(days=1)
        return marks


def _hourly(rows, key: str, fields: tuple[str, ...]) -> dict[dt.datetime, dict[str, float]]:
    found: dict[dt.datetime, dict[str, float]] = defaultdict(lambda: dict.fromkeys(fields, 0.0))
    for row in rows:
        for name in fields:
            found[row[key]][name] += row[name] or 0.0
    return found


def _backwards(now_level: float, deltas: dict[dt.datetime, float], hours: list[dt.datetime]):
    """Levels at the end of each hour of ``hours`` (oldest first), from the level now and what
    changed in each hour; never below zero (a level is a count or an amount)."""
    levels = []
    level = now_level
    for hour in reversed(hours):
        levels.append(max(0.0, round(level, 4)))
        level -= deltas.get(hour, 0.0)
    return list(reversed(levels))


def history(organization_id: int, *, now: dt.datetime, in_use: dict[str, float], queued: int):
    """Hourly CPU and GPU in use and queue length over the last :data:`HISTORY_DAYS` (three
    aggregate queries)."""
    end = now.replace(minute=0, second=0, microsecond=0)
    start = end - dt.timedelta(days=HISTORY_DAYS)
    hours = [start + dt.timedelta(hours=i) for i in range(HISTORY_DAYS * 24 + 1)]
    fields = ("cpu", "gpu")
    reservations = Reservation.objects.filter(organization_id=organization_id)
    made = _hourly(
        reservations.filter(created_at__gte=start)
        .annotate(hour=TruncHour("created_at"))
        .values("hour")
        .annotate(cpu=Sum("cpu"), gpu=Sum("gpu")),
        "hour",
        fields,
    )
    released = _hourly(
        reservations.filter(released_at__gte=start)
        .annotate(hour=TruncHour("released_at"))
        .values("hour")
        .annotate(cpu=Sum("cpu"), gpu=Sum("gpu")),
        "hour",
        fields,
    )
    into, out_of = Q(to_state=JobState.QUEUED), Q(from_state=JobState.QUEUED)
    queue_rows = (
        JobEvent.objects.filter(job__organization_id=organization_id, created_at__gte=start)
        .filter(into | out_of)
        .exclude(into & out_of)
        .annotate(hour=TruncHour("created_at"))
        .values("hour")
        .annotate(
            delta=Sum(
                Case(When(into, then=Value(1)), default=Value(-1), output_field=IntegerField())
            )
        )
    )
    queue_deltas = {row["hour"]: float(row["delta"]) for row in queue_rows}
    series = {}
    for name in fields:
        deltas = {h: made[h][name] - released[h][name] for h in set(made) | set(released)}
        series[name] = _backwards(in_use.get(name, 0.0), deltas, hours)
    series["queued"] = _backwards(float(queued), queue_deltas, hours)
    return [
        Chart("CPUs in use", "CPU", series["cpu"], start),
        Chart("GPUs in use", "GPU", series["gpu"], start),
        Chart("Jobs queued", "jobs", series["queued"], start),
    ]


def _gpu_hours_by_workspace(organization_id: int, since: dt.datetime, now: dt.datetime):
    """GPU-hours of each workspace's attempts since ``since``, from their running time (as
    ``accounting.gpu_hours`` counts them, for every workspace of the org in one query)."""
    used: dict[int, float] = defaultdict(float)
    attempts = (
        JobAttempt.objects.filter(
            job__organization_id=organization_id,
            running_at__isnull=False,
            job__requested_gpu__gt=0,
        )
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .values_list("job__workspace_id", "running_at", "finished_at", F("job__requested_gpu"))
    )
    for ws_id, running_at, finished_at, gpu in attempts.iterator():
        begin, end = max(running_at, since), finished_at or now
        if end > begin:
            used[ws_id] += (end - begin).total_seconds() / 3600 * gpu
    return {ws_id: round(hours, 4) for ws_id, hours in used.items()}


def tree_rows(tree: dict[str, Any], capacity: dict[str, float | None]) -> list[dict[str, Any]]:
    """The quota tree (``quotas.selectors.quota_tree``) below the organisation, depth first, as
    rows with their depth and a bar per shown resource on the organisation's scale; empty when
    the organisation has no quota groups (its workspaces' table says it all)."""
    if not any(child["level"] == "group" for child in tree["children"]):
        return []
    rows: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        bars = []
        for name in SHOWN:
            guaranteed = node["guaranteed"][name] or 0.0
            limit, in_use = node["limit"][name], node["usage"][name]
            scale = capacity[name] or max(guaranteed, limit or 0.0, in_use, 1.0)
            bars.append(Bar(name, guaranteed, limit, in_use, scale))
        rows.append(
            {
                "level": node["level"],
                "name": node["name"],
                "depth": depth,
                "indent": depth * 1.5,  # em
                "bars": bars,
                "running": node["running"],
            }
        )
        for child in node["children"]:
            walk(child, depth + 1)

    for child in tree["children"]:
        walk(child, 0)
    return rows


def org_overview(organization, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Everything the overview page shows of ``organization`` (thirteen queries: nine of its
    own and the quota tree's four)."""
    now = now or timezone.now()
    workspaces = list(
        organization.workspaces.filter(archived_at__isnull=True).order_by("slug")
    )  # 1
    org_quota = OrgQuota.objects.filter(organization=organization).first()  # 2
    capacity = org_quota.capacity() if org_quota else dict.fromkeys(SHOWN)
    ws_quotas = {
        q.workspace_id: q
        for q in WorkspaceQuota.objects.filter(workspace__organization=organization)  # 3
    }
    held = {
        row["workspace_id"]: row
        for row in Reservation.objects.filter(organization=organization, released_at__isnull=True)
        .values("workspace_id")
        .annotate(cpu=Sum("cpu"), memory_gb=Sum("memory_gb"), gpu=Sum("gpu"))  # 4
    }
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = (
        Job.objects.filter(organization=organization)
        .filter(state__in=[*WAITING, *ACTIVE])
        .values_list("workspace_id", "state")
        .annotate(n=Count("id"))  # 5
    )
    for ws_id, state, n in rows:
        counts[ws_id][state] = n
    period = month_start(now)
    gpu_hours = _gpu_hours_by_workspace(organization.pk, period, now)  # 6

    in_use_org = {name: sum((row[name] or 0.0) for row in held.values()) for name in SHOWN}
    rows_out = []
    for ws in workspaces:
        quota = ws_quotas.get(ws.pk) or WorkspaceQuota(workspace=ws)
        using = held.get(ws.pk, {})
        bars = []
        for name in SHOWN:
            guaranteed, limit = quota.guaranteed()[name], quota.limit()[name]
            in_use = using.get(name) or 0.0
            scale = capacity[name] or max(guaranteed, limit or 0.0, in_use, 1.0)
            bars.append(Bar(name, guaranteed, limit, in_use, scale))
        state_counts = counts.get(ws.pk, {})
        budget = quota.gpu_hours_per_month
        used = gpu_hours.get(ws.pk, 0.0)
        rows_out.append(
            {
                "workspace": ws,
                "bars": bars,
                "queued": state_counts.get(JobState.QUEUED, 0),
                "running": sum(state_counts.get(s, 0) for s in ACTIVE),
                "pending_approval": state_counts.get(JobState.PENDING_APPROVAL, 0),
                "gpu_hours": used,
                "gpu_budget": budget,
                "gpu_budget_pct": round(min(100.0, used / budget * 100), 1) if budget else None,
            }
        )
    capacity_bars = [
        Bar(name, 0.0, capacity[name], in_use_org[name], capacity[name] or max(in_use_org[name], 1))
        for name in SHOWN
    ]
    totals = {
        key: sum(row[key] for row in rows_out) for key in ("queued", "running", "pending_approval")
    }
    budgets = [row["gpu_budget"] for row in rows_out if row["gpu_budget"] is not None]
    totals["gpu_hours"] = round(sum(row["gpu_hours"] for row in rows_out), 4)
    totals["gpu_budget"] = sum(budgets) if budgets else None
    return {
        "organization": organization,
        "capacity": capacity,
        "capacity_bars": capacity_bars,
        "max_running_jobs": org_quota.max_running_jobs if org_quota else None,
        "policy": org_quota.policy if org_quota else "fifo",
        "workspaces": rows_out,
        "tree": tree_rows(quota_tree(organization), capacity),  # 10-13
        "totals": totals,
        "period": period,
        "charts": history(  # 7, 8, 9
            organization.pk, now=now, in_use=in_use_org, queued=totals["queued"]
        ),
    }


# An attempt's moments in order, each with the phase that ends there.
MOMENTS = (
    ("created_at", ""),
    ("launch_started_at", "waiting for a worker"),
    ("cluster_ready_at", "cluster start"),
    ("submitted_at", "submit"),
    ("running_at", "driver start"),
    ("finished_at", "run"),
    ("torn_down_at", "teardown"),
)


def attempt_phases(attempt: JobAttempt, *, now: dt.datetime | None = None) -> list[dict]:
    """The phases an attempt went through, each with its duration in seconds. A moment never
    recorded (a short job seen only once it had ended has no ``running_at``) joins the phases
    on either side of it ("driver start + run"); the phase under way counts up to now."""
    now = now or timezone.now()
    phases = []
    previous, skipped = None, []
    for field, label in MOMENTS:
        at = getattr(attempt, field)
        if at is None:
            skipped.append(label)
            continue
        if previous is not None:
            seconds = (at - previous).total_seconds()
            phases.append(_phase(" + ".join([*skipped, label]), seconds, ongoing=False))
        previous, skipped = at, []
    following = [label for _, label in MOMENTS][len(MOMENTS) - len(skipped) :]
    if previous is not None and following:
        if attempt.finished_at is not None:
            following = following[-1:]  # it has ended: only its teardown is under way
        phases.append(_phase(following[0], (now - previous).total_seconds(), ongoing=True))
    return phases


def _phase(label: str, seconds: float, *, ongoing: bool) -> dict:
    return {"label": label, "seconds": round(max(0.0, seconds), 1), "ongoing": ongoing}

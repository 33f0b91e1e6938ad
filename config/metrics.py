"""The metric families Manta counts as things happen, and how a process group's metrics are
gathered for a scrape. The level gauges read from the database (jobs by state, quotas, budgets)
are not here: ``jobs/metrics.py`` serves them from a snapshot the sweep keeps.

Every family is incremented in the process where its event happens: HTTP requests and the
transitions users make in the API's gunicorn workers, admission, launches, retries, preemptions,
webhook deliveries and Celery tasks in the Celery worker's pool. With
``PROMETHEUS_MULTIPROC_DIR`` set (``config/multiprocess.py``) each process writes its own files
and :func:`scrape_registry` adds them up; without it (``runserver``, tests) the values live in
this process. Here, at the bottom of the apps, so that any app can count: the families know
nothing of jobs or webhooks beyond their label values.

Tenant labels are the organisation's and the workspace's slugs (``organization``,
``workspace``): bounded by the tenants, never by the jobs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector

from . import multiprocess

TENANT = ("organization", "workspace")
# Seconds: a request or a task step, up to a long wait in a queue (a day).
FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SLOW = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)

# --- HTTP (config/metrics_http.py) -----------------------------------------------------------
HTTP_REQUESTS = Counter(
    "manta_http_requests", "API requests by route and status", ["method", "route", "status"]
)
HTTP_SECONDS = Histogram(
    "manta_http_request_duration_seconds",
    "API request latency by route",
    ["method", "route"],
    buckets=FAST,
)

# --- jobs (jobs/metrics_events.py, from the state machine and the launch) --------------------
JOB_TRANSITIONS = Counter(
    "manta_job_transitions",
    "Job state changes, by source, target and kind of move",
    [*TENANT, "from_state", "to_state", "kind"],
)
ADMISSION_WAIT = Histogram(
    "manta_admission_wait_seconds",
    "Submit (or requeue) to admitted: how long a job waited for quota",
    TENANT,
    buckets=SLOW,
)
APPROVAL_WAIT = Histogram(
    "manta_approval_wait_seconds",
    "Submit to an admin's decision, by decision",
    [*TENANT, "decision"],
    buckets=SLOW,
)
LAUNCH_PHASE = Histogram(
    "manta_launch_phase_seconds",
    "How long each phase of a launch took (cluster_start, submit)",
    [*TENANT, "phase"],
    buckets=SLOW,
)
RUN_TIME = Histogram(
    "manta_job_run_seconds",
    "Running to the end of the run, by how it ended",
    [*TENANT, "outcome"],
    buckets=SLOW,
)
WARM_CLAIMS = Counter(
    "manta_warm_pool_claims",
    "Attempts of a warm pool's shape: result=hit took a warm cluster, miss found none idle",
    ["organization", "target", "pool", "result"],
)
EVICTIONS = Counter(
    "manta_job_evictions",
    "Admitted jobs sent back to the queue, by reason (preempted, or the failure retried)",
    [*TENANT, "reason"],
)
PREEMPTIONS = Counter(
    "manta_job_preemptions",
    "Jobs preempted, by reason",
    [*TENANT, "reason"],
)
PREEMPTED_GPU_HOURS = Counter(
    "manta_preempted_gpu_hours",
    "GPU-hours preempted attempts had run when they were stopped: work lost to preemption",
    TENANT,
)
RETRIES = Counter("manta_job_retries", "Failed runs retried, by failure", [*TENANT, "reason"])
FAILURES = Counter("manta_job_failures", "Jobs that ended failed, by reason", [*TENANT, "reason"])
CLUSTER_LOST = Counter(
    "manta_cluster_lost", "Runs whose cluster stopped answering (cluster_lost)", TENANT
)

# --- webhooks (notifications/delivery.py) ----------------------------------------------------
WEBHOOK_DELIVERIES = Counter(
    "manta_webhook_deliveries",
    "Webhook delivery attempts by endpoint and outcome",
    [*TENANT, "endpoint", "outcome"],
)
WEBHOOK_LATENCY = Histogram(
    "manta_webhook_delivery_latency_seconds",
    "From the event to the end of a delivery attempt, by outcome",
    ["organization", "outcome"],
    buckets=SLOW,
)

# --- Celery (config/celery.py's signals) -----------------------------------------------------
TASK_WAIT = Histogram(
    "manta_celery_task_wait_seconds",
    "From publishing a task to a worker starting it (countdowns included)",
    ["task"],
    buckets=FAST + SLOW[3:],
)
TASK_RUNTIME = Histogram(
    "manta_celery_task_runtime_seconds",
    "How long tasks ran, by outcome",
    ["task", "outcome"],
    buckets=FAST + SLOW[3:],
)

WAKEUPS = Counter(
    "manta_wakeups",
    "Wake-ups of a task that looks again (admission, the outbox dispatcher): sent, or held back "
    "because one was already on its way (config/wakeup.py)",
    ["task", "outcome"],
)


def tenant(job) -> dict[str, str]:
    """The tenant labels of a job (or anything with ``organization`` and ``workspace``)."""
    return {"organization": job.organization.slug, "workspace": job.workspace.slug}


# --- gathering a scrape ----------------------------------------------------------------------


class GroupProcessCollector:
    """``process_*`` for the whole process group (the gunicorn workers, or a Celery worker and
    its pool): this process and every live process with metric files, summed (memory, CPU,
    descriptors; the earliest start), plus ``manta_processes`` (how many). Without
    multiprocess mode, this process alone."""

    SUMMED = (
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    )

    def collect(self) -> Iterable[Metric]:
        pids = {os.getpid(), *live_pids()}
        totals: dict[str, float] = {}
        earliest, max_fds = None, None
        for pid in pids:
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                for sample in family.samples:
                    if sample.name in self.SUMMED:
                        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
                    elif sample.name == "process_start_time_seconds":
                        earliest = min(earliest or sample.value, sample.value)
                    elif sample.name == "process_max_fds" and pid == os.getpid():
                        max_fds = sample.value
        for name, value in totals.items():
            if name.endswith("_total"):
                yield CounterMetricFamily(name[: -len("_total")], _HELP[name], value=value)
            else:
                yield GaugeMetricFamily(name, _HELP[name], value=value)
        if earliest is not None:
            yield GaugeMetricFamily(
                "process_start_time_seconds", "Start of the group's oldest process", earliest
            )
        if max_fds is not None:
            yield GaugeMetricFamily("process_max_fds", "Open file limit per process", max_fds)
        yield GaugeMetricFamily("manta_processes", "Live processes of this group", len(pids))


_HELP = {
    "process_virtual_memory_bytes": "Virtual memory of the group's processes, summed",
    "process_resident_memory_bytes": "Resident memory of the group's processes, summed",
    "process_cpu_seconds_total": "CPU time of the group's live processes, summed",
    "process_open_fds": "Open file descriptors of the group's processes, summed",
}


def live_pids() -> set[int]:
    """The live processes that wrote metric files in this group's folder."""
    if not multiprocess.enabled():
        return set()
    pids = set()
    for path in Path(os.environ[multiprocess.ENV]).glob("*.db"):
        pid = path.stem.rpartition("_")[2]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            pids.add(int(pid))
    return pids


class _Events:
    """This process's families (single-process mode), without the default process metrics
    (:class:`GroupProcessCollector` takes their place)."""

    def collect(self) -> Iterable[Metric]:
        for family in REGISTRY.collect():
            if not family.name.startswith("process_"):
                yield family


def scrape_registry(*extra) -> CollectorRegistry:
    """A registry with every event family of this process group, its process metrics and
    ``extra`` collectors."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess.enabled():
        MultiProcessCollector(registry)
    else:
        registry.register(_Events())
    registry.register(GroupProcessCollector())
    for collector in extra:
        registry.register(collector)
    return registry


def since(started: float) -> float:
    """Seconds since ``started`` (a :func:`time.monotonic` reading), never negative."""
    return max(0.0, time.monotonic() - started)

"""The launcher contract: how one job attempt becomes a running Ray job, and goes away again.

Three implementations exist (``local``, ``ray``, ``kuberay``), all with the same two phases:
:meth:`Launcher.start_cluster` brings up what the attempt runs on and returns a ``handle``;
the caller stores the handle on the attempt row, then calls :meth:`Launcher.submit`. A caller
killed between the two loses nothing: a retry submits again with the stored handle (submit is
idempotent), and a cluster whose handle never got stored is found again by
:meth:`Launcher.find_started` (and by :meth:`Launcher.find_clusters`, the sweep's look at all of
them). Every method is safe to call twice and from a different process
than the one that started the cluster: all a launcher needs to find its cluster again is the
handle (so a Celery worker killed mid-job can be replaced and the new one carries on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol

# Ray job statuses (ray.job_submission.JobStatus values) as plain strings.
RAY_PENDING = "PENDING"
RAY_RUNNING = "RUNNING"
RAY_SUCCEEDED = "SUCCEEDED"
RAY_FAILED = "FAILED"
RAY_STOPPED = "STOPPED"
RAY_TERMINAL = frozenset({RAY_SUCCEEDED, RAY_FAILED, RAY_STOPPED})


@dataclasses.dataclass(frozen=True)
class LaunchRequest:
    """Everything a launcher needs to start one attempt of a job.

    ``spec`` is the job's resolved spec (see ``jobs/spec.py``)::

        {"image": "rayproject/ray:2.60.0", "entrypoint": "python main.py",
         "runtime_env": {"pip": [...], "env_vars": {...}, "working_dir": "..."},
         "head": {"cpu": 0, "memory_gb": 2, "gpu": 0},
         "worker_groups": [{"name": "workers", "replicas": 1, "min_replicas": 0, "max_replicas": 4,
                            "cpu": 1, "memory_gb": 1, "gpu": 0, "resources": {"TPU": 1}}],
         "max_runtime_seconds": 3600, "max_retries": 0, "priority": 5,
         "ttl_seconds_after_finished": 300}
    """

    submission_id: str  # the attempt id; also the Ray job's submission_id (idempotent submit)
    cluster_name: str  # DNS-safe, unique per attempt, e.g. "manta-acme-ml-42-1"
    spec: dict[str, Any]
    labels: dict[str, str]  # org / workspace / job ids, e.g. {"manta.dev/org": "acme", ...}
    target_config: dict[str, Any]  # the compute target's config (secrets already decrypted)
    # Code packages the spec names (runtime_env.working_dir "manta://packages/<sha256>"), each
    # with a path on this host holding its zip; the launcher hands them to the cluster.
    packages: dict[str, str] = dataclasses.field(default_factory=dict)
    # The GPU flavor admission chose ("h100"; "": untyped GPUs, or none): the GPU nodes get
    # only devices (local) or nodes (kuberay) of that type.
    gpu_flavor: str = ""


@dataclasses.dataclass(frozen=True)
class RayJobState:
    """What Ray says about a submitted job."""

    status: str  # one of the RAY_* constants
    message: str = ""
    exit_code: int | None = None
    # Why a terminal state happened when the launcher knows better than Ray, e.g. "oom_killed":
    # the attempt's failure reason.
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class LogPart:
    """A piece of a driver log: ``text`` covers the log's bytes from ``start`` to ``end``.

    Offsets count the bytes the driver wrote. The text is clean (see ``cluster_text``): each
    byte that is not text is one U+FFFD, so ``cluster_text.width(text) == end - start``.
    """

    text: str
    start: int
    end: int


class LaunchError(Exception):
    """The cluster or the submission could not be brought up; the attempt fails with it."""


class LaunchAbandoned(LaunchError):
    """The caller no longer wants the cluster (its attempt was cancelled, preempted or ran past
    its deadline): the start stopped and what had started is torn down."""


class NodeFailures(LaunchError):
    """A node of the cluster died more often than it may be restarted: the attempt fails with
    reason ``node_failures``."""


class Launcher(Protocol):
    """What every launcher does; ``launcher_for(kind, config)`` picks the implementation."""

    kind: str

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        """What start_cluster() and submit() would create, as JSON-able data, without creating
        anything. Raises LaunchError for a request this launcher cannot run."""

    def start_cluster(
        self, request: LaunchRequest, *, abandon: Callable[[], str] | None = None
    ) -> dict[str, Any]:
        """Bring up what the attempt runs on and return its handle (plain JSON, for the caller
        to store before it calls submit()).

        ``abandon`` may be asked while a slow start runs whether the caller still wants the
        cluster: a non-empty answer (why) tears down what started and raises LaunchAbandoned.
        Idempotent: called again for the same submission_id it adopts what already runs
        instead of starting a second one. Raises LaunchError when the cluster cannot come up.
        """

    def submit(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any]:
        """Run the request's entrypoint on the cluster in ``handle``, as the Ray job
        ``request.submission_id``; returns the handle. Idempotent: a job that already exists
        under this submission_id is adopted, and the entrypoint never runs twice."""

    def status(self, handle: dict[str, Any]) -> RayJobState:
        """The Ray job's current status. Raises LaunchError when the cluster is unreachable."""

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        """The driver log so far (the last ``tail`` lines when given), at most its last few
        MiB: a log is never read whole."""

    def log_part(self, handle: dict[str, Any], *, since: int | None = None, limit: int) -> LogPart:
        """At most ``limit`` bytes of the driver log: from byte ``since`` on when given, else
        its end. Raises LaunchError when the cluster cannot say."""

    def follow_logs(self, handle: dict[str, Any]) -> Iterator[str]:
        """The driver log from its start, chunk by chunk as it is written, until the job ends.
        Raises LaunchError when the cluster stops answering first."""

    def heal(self, handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
        """Bring back the cluster's dead worker nodes, with the same spec; returns the nodes
        restarted (the handle, updated in place, must then be stored again). Raises
        NodeFailures once a node died more than ``max_restarts`` times. Launchers whose
        cluster heals itself (kuberay) or is not ours (ray) return []."""

    def stop_driver(self, handle: dict[str, Any]) -> bool:
        """Ask the Ray job's driver to stop and leave the cluster up: Ray's ``stop_job`` sends
        SIGTERM to the driver and its children, then SIGKILL after the job's
        ``RAY_JOB_STOP_WAIT_TIME_S``. True when the request reached Ray; launchers that cannot
        reach the driver (kuberay: its submitter, not Manta, talks to Ray) return False. Raises
        LaunchError when the cluster does not answer."""

    def stop(self, handle: dict[str, Any]) -> None:
        """Stop the Ray job and tear down whatever start_cluster() started. Idempotent, never
        raises for something that is already gone."""

    def find_started(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """Handles of what start_cluster(request) left running, found without a stored handle
        (a start whose caller died, or was cancelled, before storing it): stop them, and the
        attempt leaves nothing behind. [] when nothing of this request is found."""

    def find_clusters(self, target_config: dict[str, Any]) -> list[dict[str, Any]]:
        """Handles of every cluster this launcher started for ``target_config`` that it can
        list without a stored handle, running or not; which of them no attempt owns any more is
        the caller's to decide. Launchers that cannot list theirs return []."""


def launch(launcher: Launcher, request: LaunchRequest) -> dict[str, Any]:
    """start_cluster() then submit() in one call, for tests and benchmarks (the service calls
    the two itself, storing the handle in between). What started is stopped again when
    submitting fails."""
    handle = launcher.start_cluster(request)
    try:
        return launcher.submit(handle, request)
    except BaseException:
        launcher.stop(handle)
        raise

"""The ``ray`` launcher: submit to an existing, long-running Ray cluster (no cluster lifecycle).

Target config: ``address`` (the dashboard, ``http://host:8265``), the cluster's auth token
(stored encrypted on the compute target, handed in as ``token``) and the operator's
``allowed_networks``. The address is a tenant's input: it passes the SSRF policy when the
target is saved and again before every connection, and a plain-http connection goes to the
address that was checked, so a DNS answer that changes in between cannot redirect it.

Every request to the cluster is bounded (a total deadline, no redirects, a size cap on the
answer: see ``ray_jobs.make_client``); the Jobs API answers only with a job's whole log, so a
log longer than ``ray_jobs.LOG_ANSWER_LIMIT`` cannot be read live (Manta's copy answers).

The driver is given the head's spec as Ray entrypoint resources (CPUs, GPUs, memory), so Ray
schedules it where that much is free. Worker groups are not provisioned: the job's tasks use
whatever the shared cluster has (see the README's security section).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from config import ssrf

from . import ray_jobs
from .base import LaunchError, LaunchRequest, LogPart, RayJobState

GIB = 1024**3


class RayClusterLauncher:
    kind = "ray"

    def __init__(self, target_config: dict[str, Any]):
        self.address = target_config.get("address", "")
        self.token = target_config.get("token") or None
        self.allowed_networks = list(target_config.get("allowed_networks") or [])
        if not self.address:
            raise LaunchError("the ray compute target has no address")

    def _submission(self, request: LaunchRequest) -> dict[str, Any]:
        head = request.spec.get("head") or {}
        return {
            "submission_id": request.submission_id,
            "entrypoint": request.spec["entrypoint"],
            "runtime_env": ray_jobs.clean_runtime_env(request.spec.get("runtime_env")),
            "entrypoint_num_cpus": float(head.get("cpu") or 0),
            "entrypoint_num_gpus": float(head.get("gpu") or 0),
            "entrypoint_memory": int(float(head.get("memory_gb") or 0) * GIB),
            "metadata": dict(request.labels),
        }

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "address": self.address,
            "cluster_name": None,
            "submission": self._submission(request),
        }

    def start_cluster(
        self, request: LaunchRequest, *, abandon: Callable[[], str] | None = None
    ) -> dict[str, Any]:
        """The handle of the shared cluster (nothing starts, so nothing to abandon)."""
        return {
            "address": self.address,
            "dashboard_url": self.address,
            "submission_id": request.submission_id,
            "cluster_name": request.cluster_name,
        }

    def submit(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any]:
        """Submit the entrypoint; a job already there under this submission_id is adopted."""
        ray_jobs.submit_idempotent(
            self._client(), **self._submission(request), packages=request.packages
        )
        return handle

    def _client(self):
        try:
            where = ssrf.check_compute_address(self.address, self.allowed_networks)
        except ssrf.UnsafeURL as exc:
            raise LaunchError(f"the ray target's address is refused: {exc}") from exc
        if where.scheme == "https":
            address = self.address  # TLS binds the name: a rebound address fails the handshake
        else:
            host = f"[{where.address}]" if ":" in where.address else where.address
            address = f"http://{host}:{where.port}"
        return ray_jobs.make_client(address, self.token)

    def status(self, handle: dict[str, Any]) -> RayJobState:
        return ray_jobs.job_state(self._client(), handle["submission_id"])

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        return ray_jobs.job_logs(self._client(), handle["submission_id"], tail=tail)

    def log_part(self, handle: dict[str, Any], *, since: int | None = None, limit: int) -> LogPart:
        return ray_jobs.log_part(self._client(), handle["submission_id"], since=since, limit=limit)

    def follow_logs(self, handle: dict[str, Any]) -> Iterator[str]:
        return ray_jobs.follow_logs(self._client(), handle["submission_id"])

    def heal(self, handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
        return []  # a shared cluster's nodes are its operator's to keep

    def stop_driver(self, handle: dict[str, Any]) -> bool:
        ray_jobs.stop_job(self._client(), handle["submission_id"])
        return True

    def stop(self, handle: dict[str, Any]) -> None:
        # An unreachable cluster has nothing of ours left to stop.
        with contextlib.suppress(LaunchError):
            ray_jobs.stop_job(self._client(), handle["submission_id"])

    def find_started(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """None: start_cluster() starts nothing, and a Ray job exists only once submit() ran
        with a handle the caller had already stored."""
        return []

    def find_clusters(self, target_config: dict[str, Any]) -> list[dict[str, Any]]:
        """None: the cluster is not ours."""
        return []

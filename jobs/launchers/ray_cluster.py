"""The ``ray`` launcher: submit to an existing, long-running Ray cluster (no cluster lifecycle).

Target config: ``address`` (the dashboard, ``http://host:8265``) and the cluster's auth token
(stored encrypted on the compute target, handed in as ``token``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from . import ray_jobs
from .base import LaunchError, LaunchRequest, RayJobState


class RayClusterLauncher:
    kind = "ray"

    def __init__(self, target_config: dict[str, Any]):
        self.address = target_config.get("address", "")
        self.token = target_config.get("token") or None
        if not self.address:
            raise LaunchError("the ray compute target has no address")

    def _submission(self, request: LaunchRequest) -> dict[str, Any]:
        return {
            "submission_id": request.submission_id,
            "entrypoint": request.spec["entrypoint"],
            "runtime_env": ray_jobs.clean_runtime_env(request.spec.get("runtime_env")),
            "entrypoint_num_cpus": 0,
            "metadata": dict(request.labels),
        }

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "address": self.address,
            "cluster_name": None,
            "submission": self._submission(request),
        }

    def start_cluster(self, request: LaunchRequest) -> dict[str, Any]:
        return {
            "address": self.address,
            "dashboard_url": self.address,
            "submission_id": request.submission_id,
            "cluster_name": request.cluster_name,
        }

    def submit(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any]:
        ray_jobs.submit_idempotent(self._client(), **self._submission(request))
        return handle

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        return self.submit(self.start_cluster(request), request)

    def _client(self):
        return ray_jobs.make_client(self.address, self.token)

    def status(self, handle: dict[str, Any]) -> RayJobState:
        return ray_jobs.job_state(self._client(), handle["submission_id"])

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        return ray_jobs.job_logs(self._client(), handle["submission_id"], tail=tail)

    def stop(self, handle: dict[str, Any]) -> None:
        # An unreachable cluster has nothing of ours left to stop.
        with contextlib.suppress(LaunchError):
            ray_jobs.stop_job(self._client(), handle["submission_id"])

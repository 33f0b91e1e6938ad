"""``KubeRayLauncher``: the launcher contract (``..base.Launcher``) over one RayJob per attempt.

A RayJob is cluster and submission in one object: KubeRay starts the RayCluster and, once it is
up, runs ``ray job submit`` with ``spec.jobId`` (the attempt's submission id). So
:meth:`KubeRayLauncher.start_cluster` creates the RayJob, and
:meth:`KubeRayLauncher.submit` has nothing left to send: it checks the RayJob is still there and
still this submission's. The caller sees the same two phases as with every launcher.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client as k8s

from .. import cluster_text
from ..base import RAY_FAILED, RAY_TERMINAL, LaunchError, LaunchRequest, LogPart, RayJobState
from .client import KubeClient
from .manifest import rayjob_state, render_raycluster, render_rayjob

FOLLOW_POLL = 1.0


class KubeRayLauncher:
    """Runs each attempt as a KubeRay RayJob. See the package docstring for the target config."""

    kind = "kuberay"

    def __init__(
        self, target_config: Mapping[str, Any], *, api_client: k8s.ApiClient | None = None
    ) -> None:
        """``target_config`` says how to reach the cluster; ``api_client`` overrides it."""
        self._kube = KubeClient(target_config, api_client=api_client)

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        """The RayJob manifest start_cluster() would create; touches no cluster."""
        return {"kind": self.kind, "manifest": render_rayjob(request)}

    def start_cluster(
        self, request: LaunchRequest, *, abandon: Callable[[], str] | None = None
    ) -> dict[str, Any]:
        """Create the namespace (if needed) and the RayJob; return the handle.

        Idempotent: a RayJob of this name that carries the same ``spec.jobId`` is adopted;
        one with another job id raises LaunchError instead. ``abandon`` is not asked: creating
        is one API call, and KubeRay brings the cluster up after it returns.
        """
        manifest = render_rayjob(request)
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        self._kube.ensure_namespace(namespace, request.labels)
        if not self._kube.create_rayjob(manifest):
            self._check_ours(namespace, name, request.submission_id)
        return {"namespace": namespace, "name": name, "submission_id": request.submission_id}

    def submit(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any]:
        """Nothing to send: the RayJob start_cluster() created is the submission (KubeRay
        submits ``spec.jobId`` once its cluster is up, and never twice). Checks the RayJob is
        still there and still this submission's; returns the handle."""
        self._check_ours(handle["namespace"], handle["name"], request.submission_id)
        return handle

    def status(self, handle: dict[str, Any]) -> RayJobState:
        """The job's state from the RayJob's status (see :func:`.manifest.rayjob_state`). A
        RayJob that no longer exists is FAILED; an unreachable or erroring API server raises
        LaunchError."""
        namespace, name = handle["namespace"], handle["name"]
        rayjob = self._kube.get_rayjob(namespace, name)
        if rayjob is None:
            return RayJobState(RAY_FAILED, f"RayJob {namespace}/{name} no longer exists")
        return rayjob_state(rayjob)

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        """The driver log: in K8sJobMode the submitter pod follows the Ray job's logs, so its
        log is the driver's (as long as the kubelet keeps of it: it rotates container logs at
        its containerLogMaxSize). Empty until the submitter pod has started."""
        text = self._kube.submitter_log(handle["namespace"], handle["name"], tail=tail)
        return cluster_text.clean(text)

    def log_part(self, handle: dict[str, Any], *, since: int | None = None, limit: int) -> LogPart:
        """At most ``limit`` bytes of the submitter pod's log, from byte ``since`` on when
        given, else its end (the API server answers with the whole log only)."""
        return cluster_text.part_of(self.logs(handle), since=since, limit=limit)

    def follow_logs(self, handle: dict[str, Any]) -> Iterator[str]:
        """The submitter pod's log, polled once a second (Kubernetes streams it too, but the
        pod of a retried submitter changes under a stream)."""
        sent = 0
        while True:
            text = self.logs(handle)
            if len(text) > sent:
                yield text[sent:]
                sent = len(text)
            if self.status(handle).status in RAY_TERMINAL:
                return
            time.sleep(FOLLOW_POLL)

    def heal(self, handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
        # KubeRay heals worker nodes itself: their pods restart in place (restartPolicy
        # Always, see manifest._worker_groups) and the RayCluster controller recreates a
        # deleted one.
        return []

    def stop_driver(self, handle: dict[str, Any]) -> bool:
        # The submitter pod talks to the cluster's Jobs API, not Manta: a preempted RayJob is
        # deleted when its grace has passed (its pods get Kubernetes' own SIGTERM then).
        return False

    def stop(self, handle: dict[str, Any]) -> None:
        """Delete the RayJob, in the foreground (its RayCluster and submitter Job go with it),
        and the warm RayCluster the handle names (``ray_cluster``: KubeRay deletes no cluster a
        RayJob only selected). Already gone is fine; another API error raises LaunchError."""
        if handle.get("name"):
            self._kube.delete_rayjob(handle["namespace"], handle["name"])
        if handle.get("ray_cluster"):
            self._kube.delete_raycluster(handle["namespace"], handle["ray_cluster"])

    # --- warm RayClusters (jobs/pool_targets.py) ---------------------------------------------

    def start_warm(self, request: LaunchRequest) -> dict[str, Any]:
        """Create a warm RayCluster of ``request``'s shape (see
        :func:`.manifest.render_raycluster`); return its handle. One that exists with the same
        labels (a start retried) is adopted; another raises LaunchError."""
        manifest = render_raycluster(request)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        self._kube.ensure_namespace(namespace, request.labels)
        if not self._kube.create_raycluster(manifest):
            existing = self._kube.get_raycluster(namespace, name) or {}
            labels = (existing.get("metadata") or {}).get("labels") or {}
            if any(labels.get(key) != value for key, value in request.labels.items()):
                raise LaunchError(f"RayCluster {namespace}/{name} exists and is not this one")
        return {"namespace": namespace, "ray_cluster": name, "submission_id": request.submission_id}

    def bind_warm(self, handle: dict[str, Any], request: LaunchRequest) -> dict[str, Any] | None:
        """Run ``request`` on the warm RayCluster of ``handle``: create its RayJob with
        ``spec.clusterSelector`` naming it (a RayJob of this submission that exists already is
        adopted). Returns the attempt's handle, which names both (stopping it deletes both);
        None when the RayCluster is gone or being deleted (the caller drops it)."""
        namespace, cluster = handle["namespace"], handle["ray_cluster"]
        if not self.is_alive(handle):
            return None
        manifest = render_rayjob(request, ray_cluster=cluster)
        if manifest["metadata"]["namespace"] != namespace:
            raise LaunchError(f"RayCluster {namespace}/{cluster} is not in the job's namespace")
        name = manifest["metadata"]["name"]
        if not self._kube.create_rayjob(manifest):
            self._check_ours(namespace, name, request.submission_id)
        return {
            "namespace": namespace,
            "name": name,
            "submission_id": request.submission_id,
            "ray_cluster": cluster,
        }

    def is_alive(self, handle: dict[str, Any]) -> bool:
        """The handle's warm RayCluster exists and is not being deleted."""
        found = self._kube.get_raycluster(handle["namespace"], handle["ray_cluster"])
        return found is not None and not (found.get("metadata") or {}).get("deletionTimestamp")

    def find_warm(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """The handles of the RayClusters in ``namespace`` that carry ``labels`` (a pool's),
        each with its labels (``labels``) for the caller to match against its rows."""
        return [
            {
                "namespace": namespace,
                "ray_cluster": item["metadata"]["name"],
                "labels": dict(item["metadata"].get("labels") or {}),
            }
            for item in self._kube.list_rayclusters(namespace, labels)
        ]

    def find_started(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """The request's RayJob, when it exists and carries its submission id: a RayJob is named
        by its attempt (the request's cluster_name) in a namespace the request determines, so
        one read finds it without a stored handle. Raises LaunchError when the API server
        cannot say."""
        manifest = render_rayjob(request)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        existing = self._kube.get_rayjob(namespace, name)
        if existing is None or (existing.get("spec") or {}).get("jobId") != request.submission_id:
            return []
        return [{"namespace": namespace, "name": name, "submission_id": request.submission_id}]

    def find_clusters(self, target_config: dict[str, Any]) -> list[dict[str, Any]]:
        """None: listing RayJobs by label would need rights to list them in every namespace,
        which a tenant's kubeconfig seldom grants. The RayJobs of ended attempts are deleted
        by :meth:`stop`, or by KubeRay after they finish (``ttlSecondsAfterFinished``) or
        outlive ``activeDeadlineSeconds``."""
        return []

    def close(self) -> None:
        """Release the HTTP connection pool (safe to call more than once)."""
        self._kube.close()

    def _check_ours(self, namespace: str, name: str, submission_id: str) -> None:
        """Raise LaunchError unless the RayJob exists, carries ``submission_id`` as its job id
        and is not being deleted."""
        existing = self._kube.get_rayjob(namespace, name)
        if existing is None:
            raise LaunchError(f"RayJob {namespace}/{name} no longer exists")
        job_id = (existing.get("spec") or {}).get("jobId")
        if job_id != submission_id:
            raise LaunchError(
                f"RayJob {namespace}/{name} already exists for submission {job_id!r}, "
                f"not {submission_id!r}"
            )
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise LaunchError(f"RayJob {namespace}/{name} exists but is being deleted")

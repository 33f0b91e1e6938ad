"""Placing a RayJob's GPU pods on the nodes of their GPU flavor: the target's config declares
each flavor's node labels (``gpu_flavors: {"h100": {"count": 8, "node_labels":
{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}``), and every pod that requests GPUs
gets them as its nodeSelector, so a job admitted on ``h100`` never lands on another flavor's
nodes. Pods without GPUs (a head that only runs the driver) go anywhere."""

from __future__ import annotations

from typing import Any

from ..base import LaunchError, LaunchRequest

GPU_RESOURCE = "nvidia.com/gpu"


def node_selector(request: LaunchRequest) -> dict[str, str] | None:
    """The node labels of the request's flavor (None: untyped GPUs, no selector). Raises
    LaunchError when the target does not declare the flavor (its config changed under the
    job) or declares flavors and the job has none: its GPUs could land on any of them."""
    declared = (request.target_config or {}).get("gpu_flavors") or {}
    flavor = request.gpu_flavor
    if not flavor:
        if declared and _asks_for_gpus(request.spec):
            raise LaunchError(
                "the compute target declares GPU flavors and this attempt has none: "
                "its GPUs could land on any flavor's nodes"
            )
        return None
    if flavor not in declared:
        raise LaunchError(f"the compute target declares no GPU flavor {flavor!r}")
    return {str(k): str(v) for k, v in declared[flavor]["node_labels"].items()}


def place_gpu_pods(cluster_spec: dict[str, Any], selector: dict[str, str] | None) -> None:
    """Give every pod template of ``cluster_spec`` that requests GPUs the nodeSelector."""
    if not selector:
        return
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    for group in groups:
        pod = group["template"]["spec"]
        if any(GPU_RESOURCE in c["resources"].get("limits", {}) for c in pod["containers"]):
            pod["nodeSelector"] = dict(selector)


def _asks_for_gpus(spec: dict[str, Any]) -> bool:
    nodes = [spec.get("head") or {}, *(spec.get("worker_groups") or [])]
    return any(node.get("gpu") for node in nodes)

"""The ``kuberay`` launcher: one KubeRay ``RayJob`` (ray.io/v1) per attempt, on Kubernetes.

KubeRay does the heavy lifting: it creates a RayCluster from ``spec.rayClusterSpec``, runs
``ray job submit`` in a submitter Kubernetes Job (``K8sJobMode``) with ``spec.jobId`` as the
submission id, tears the cluster down after the job finishes, and retries up to
``spec.backoffLimit`` times. Here: ``manifest.py`` renders the RayJob and reads its status
(pure), ``client.py`` makes the Kubernetes API calls, ``launcher.py`` is the launcher contract
over both, and ``crd.py`` checks a manifest against KubeRay's CRD (tests and tooling).

Target config keys (all optional except a way to reach the cluster):

* ``kubeconfig``: the kubeconfig's YAML text or the parsed mapping (no exec or auth-provider
  plugins, no file references; a path on this host is refused);
* ``context``: the kubeconfig context to use (default: its current-context);
* ``in_cluster``: ``true`` to use the pod's service account instead of a kubeconfig, only with
  ``in_cluster_allowed`` (the operator's MANTA_KUBERAY_IN_CLUSTER);
* ``namespace_pattern``: default ``"manta-{workspace}"``; ``{org}`` and ``{workspace}`` are the
  slugs from the request labels;
* ``head_pod_cpu``: the head container's CPU when the spec gives the head 0 Ray CPUs (default 1);
* ``request_timeout_seconds``: per Kubernetes API call (default 30).
"""

from .client import build_api_client
from .crd import validate_rayjob
from .launcher import KubeRayLauncher
from .manifest import (
    DEFAULT_NAMESPACE_PATTERN,
    namespace_for,
    ray_version_from_image,
    rayjob_state,
    render_rayjob,
)

__all__ = [
    "DEFAULT_NAMESPACE_PATTERN",
    "KubeRayLauncher",
    "build_api_client",
    "namespace_for",
    "ray_version_from_image",
    "rayjob_state",
    "render_rayjob",
    "validate_rayjob",
]

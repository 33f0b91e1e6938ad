"""The Kubernetes API calls of the kuberay launcher: namespaces, RayJobs and the submitter pod's
log, through an ``ApiClient`` of its own (never the process-wide default configuration, so
launchers for different clusters can live in one process).

Connection-level failures and API errors become :class:`LaunchError` naming the operation and
the API server's own message; the answers that mean "already there" (409 on create) or "already
gone" (404) are returned as values, for the launcher to interpret.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from workspaces import kubeconfig as tenant_kubeconfig

from ..base import LaunchError
from .manifest import (
    CLUSTER_PLURAL,
    GROUP,
    LABEL_ORG,
    LABEL_WORKSPACE,
    MANAGED_BY,
    PLURAL,
    SUBMITTER_CONTAINER,
    SUBMITTER_POD_SELECTOR,
    VERSION,
)

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

T = TypeVar("T")


class KubeClient:
    """One Kubernetes cluster, as the target config reaches it (``api_client`` overrides it).
    The ``ApiClient`` is created on first use."""

    def __init__(
        self, target_config: Mapping[str, Any], *, api_client: k8s.ApiClient | None = None
    ) -> None:
        self._target_config = dict(target_config)
        self._api_client = api_client
        self._timeout = float(self._target_config.get("request_timeout_seconds", 30))

    def close(self) -> None:
        """Release the HTTP connection pool (safe to call more than once)."""
        if self._api_client is not None:
            self._api_client.close()
            self._api_client = None

    def ensure_namespace(self, namespace: str, labels: Mapping[str, str]) -> None:
        """Create the namespace unless it exists (or this account may not create namespaces,
        which is how clusters with pre-provisioned namespaces are set up: if it is actually
        missing, creating the RayJob fails next with a NotFound that names it)."""
        body = k8s.V1Namespace(
            metadata=k8s.V1ObjectMeta(
                name=namespace,
                labels={
                    **MANAGED_BY,
                    **{k: v for k, v in labels.items() if k in (LABEL_ORG, LABEL_WORKSPACE)},
                },
            )
        )
        what = f"create namespace {namespace}"
        try:
            self._call(what, k8s.CoreV1Api(self._client()).create_namespace, body)
        except ApiException as exc:
            if exc.status not in (403, 409):
                raise _api_error(what, exc) from exc

    def create_rayjob(self, manifest: Mapping[str, Any]) -> bool:
        """Create the RayJob; False when one of that name exists already."""
        return self._create(PLURAL, "RayJob", manifest)

    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RayJob as the API server has it (None when there is none)."""
        return self._get(PLURAL, "RayJob", namespace, name)

    def delete_rayjob(self, namespace: str, name: str) -> None:
        """Delete the RayJob with foreground propagation (KubeRay's finalizer stops the Ray
        job, then its RayCluster and submitter Job go). Already gone is fine."""
        self._delete(PLURAL, "RayJob", namespace, name)

    def create_raycluster(self, manifest: Mapping[str, Any]) -> bool:
        """Create the RayCluster; False when one of that name exists already."""
        return self._create(CLUSTER_PLURAL, "RayCluster", manifest)

    def get_raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RayCluster as the API server has it (None when there is none)."""
        return self._get(CLUSTER_PLURAL, "RayCluster", namespace, name)

    def delete_raycluster(self, namespace: str, name: str) -> None:
        """Delete the RayCluster in the foreground (its pods, services and the auth Secret
        KubeRay made for it go with it). Already gone is fine."""
        self._delete(CLUSTER_PLURAL, "RayCluster", namespace, name)

    def list_rayclusters(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The RayClusters of ``namespace`` that carry every one of ``labels`` (none when the
        namespace does not exist)."""
        what = f"list RayClusters in {namespace}"
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        try:
            found = self._call(
                what,
                self._custom().list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                CLUSTER_PLURAL,
                label_selector=selector,
            )
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise _api_error(what, exc) from exc
        return list(found.get("items") or [])

    def _create(self, plural: str, kind: str, manifest: Mapping[str, Any]) -> bool:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        what = f"create {kind} {namespace}/{name}"
        try:
            self._call(
                what,
                self._custom().create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                manifest,
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise _api_error(what, exc) from exc
        return True

    def _get(self, plural: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        what = f"get {kind} {namespace}/{name}"
        try:
            return self._call(
                what,
                self._custom().get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(what, exc) from exc

    def _delete(self, plural: str, kind: str, namespace: str, name: str) -> None:
        what = f"delete {kind} {namespace}/{name}"
        try:
            self._call(
                what,
                self._custom().delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                propagation_policy="Foreground",
                body=k8s.V1DeleteOptions(propagation_policy="Foreground"),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _api_error(what, exc) from exc

    def submitter_log(self, namespace: str, name: str, *, tail: int | None = None) -> str:
        """The log of the newest pod of the RayJob's submitter Job ("" until one has started;
        the newest because the submitter Job retries with a new pod)."""
        core = k8s.CoreV1Api(self._client())
        what = f"list submitter pods of {namespace}/{name}"
        try:
            pods = self._call(
                what,
                core.list_namespaced_pod,
                namespace,
                label_selector=SUBMITTER_POD_SELECTOR.format(name=name),
            )
        except ApiException as exc:
            if exc.status == 404:
                return ""
            raise _api_error(what, exc) from exc
        if not pods.items:
            return ""
        pod = max(pods.items, key=_pod_age_key)
        kwargs: dict[str, Any] = {"container": SUBMITTER_CONTAINER}
        if tail is not None:
            kwargs["tail_lines"] = tail
        what = f"read log of pod {namespace}/{pod.metadata.name}"
        try:
            # Raw bytes: with preloading, the client json-decodes the body and str()s the result,
            # which turns a log that happens to be JSON into a Python repr.
            response = self._call(
                what,
                core.read_namespaced_pod_log,
                pod.metadata.name,
                namespace,
                _preload_content=False,
                **kwargs,
            )
        except ApiException as exc:
            # 400: the container has not started yet; 404: the pod went away meanwhile.
            if exc.status in (400, 404):
                return ""
            raise _api_error(what, exc) from exc
        try:
            return response.data.decode("utf-8", errors="replace")
        finally:
            response.release_conn()

    def _client(self) -> k8s.ApiClient:
        if self._api_client is None:
            self._api_client = build_api_client(self._target_config)
        return self._api_client

    def _custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self._client())

    def _call(self, what: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the API; connection-level failures become LaunchError, HTTP errors stay
        ApiException for the caller to interpret."""
        try:
            return method(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 0:  # the client's wrapping of TLS errors
                raise LaunchError(f"{what}: Kubernetes API unreachable: {exc.reason}") from exc
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LaunchError(f"{what}: Kubernetes API unreachable: {exc}") from exc


def build_api_client(target_config: Mapping[str, Any]) -> k8s.ApiClient:
    """A new ApiClient for ``target_config`` (``in_cluster`` or ``kubeconfig`` as a path, YAML
    text or mapping, with an optional ``context``). Never touches the global default
    configuration nor writes the kubeconfig back. Raises LaunchError when the config is
    missing or unusable."""
    configuration = k8s.Configuration()
    context = target_config.get("context")
    try:
        if target_config.get("in_cluster"):
            if not target_config.get("in_cluster_allowed"):
                raise LaunchError(
                    "in_cluster would use the platform's own service account; this deployment "
                    "does not allow it (MANTA_KUBERAY_IN_CLUSTER)"
                )
            k8s_config.load_incluster_config(client_configuration=configuration)
        elif target_config.get("kubeconfig"):
            # A tenant's kubeconfig: checked at save, and again here, before anything in it
            # can run a command or read a file in this process.
            try:
                kubeconfig = dict(tenant_kubeconfig.load(target_config["kubeconfig"]))
            except ValueError as exc:
                raise LaunchError(f"kubeconfig {exc}") from exc
            refused = tenant_kubeconfig.problems(kubeconfig)
            if refused:
                raise LaunchError("kubeconfig refused: " + "; ".join(refused))
            k8s_config.load_kube_config_from_dict(
                kubeconfig,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            raise LaunchError("the kuberay target needs `kubeconfig` or `in_cluster: true`")
    except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError, ValueError) as exc:
        raise LaunchError(f"cannot load the Kubernetes config: {exc}") from exc
    return k8s.ApiClient(configuration=configuration)


def _pod_age_key(pod: k8s.V1Pod) -> tuple[datetime.datetime, str]:
    """Sorts pods oldest first (name breaks ties, and pods without a timestamp come first)."""
    created = pod.metadata.creation_timestamp or _EPOCH
    return created, pod.metadata.name or ""


def _api_error(what: str, exc: ApiException) -> LaunchError:
    """A LaunchError naming the operation and the API server's own message."""
    detail = exc.reason or ""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            detail = body["message"]
    except (TypeError, ValueError):
        pass
    return LaunchError(f"{what} failed: HTTP {exc.status}: {detail}")

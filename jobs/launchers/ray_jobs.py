"""Helpers for talking to one Ray cluster's Jobs API (the dashboard) with a bearer token.

Shared by every launcher that ends up with a dashboard URL and a token (``local``, ``ray``), so
nothing here knows how the cluster came to be. What these helpers promise:

* :func:`make_client` talks to exactly the address it is given (Ray would otherwise let
  ``RAY_ADDRESS``/``RAY_API_SERVER_ADDRESS`` in this process's environment silently redirect it),
  sends ``Authorization: Bearer <token>`` on every request and never waits forever on a request.
* :func:`submit_idempotent` never starts a second Ray job for a ``submission_id`` the cluster
  already knows: a re-submit adopts the existing job.
* Every failure to reach or use the cluster is raised as :class:`LaunchError`, never as a Ray or
  ``requests`` exception, so callers have one error type to handle.

``ray`` is imported lazily: it takes seconds to import and most processes that import the
launchers (web workers) never talk to a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .base import RAY_TERMINAL, LaunchError, RayJobState

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

logger = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 30.0

# Ray lets these override the address given to JobSubmissionClient (see
# ray.dashboard.utils.get_address_for_submission_client).
_ADDRESS_OVERRIDE_ENV_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_env_lock = threading.Lock()

# runtime_env keys a job spec may carry; anything else is not ours to pass through.
RUNTIME_ENV_KEYS = ("pip", "env_vars", "working_dir")


class JobConflict(LaunchError):
    """The cluster already has a different job under this submission_id; retrying won't help."""


def auth_headers(token: str | None) -> dict[str, str]:
    """The HTTP headers that authenticate a request to a token-protected Ray dashboard."""
    return {"Authorization": f"Bearer {token}"} if token else {}


@functools.cache
def _client_class() -> type[JobSubmissionClient]:
    from ray.job_submission import JobSubmissionClient

    class _TimeoutJobSubmissionClient(JobSubmissionClient):
        """A JobSubmissionClient whose every HTTP request has a timeout.

        Ray's public methods take no timeout, and a dashboard that accepts the connection but
        never answers would otherwise hang a Celery task forever.
        """

        def __init__(self, *args: Any, request_timeout: float, **kwargs: Any) -> None:
            # Set before super().__init__, which already sends the version-check requests.
            self._request_timeout = request_timeout
            super().__init__(*args, **kwargs)

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self._request_timeout)
            return super()._do_request(method, endpoint, **kwargs)

    return _TimeoutJobSubmissionClient


def make_client(
    address: str, token: str | None, *, timeout: float = DEFAULT_REQUEST_TIMEOUT
) -> JobSubmissionClient:
    """A ``JobSubmissionClient`` for the dashboard at ``address`` (``http://host:port``).

    Raises LaunchError when the dashboard is unreachable or rejects the token.
    """
    cls = _client_class()
    try:
        if not any(k in os.environ for k in _ADDRESS_OVERRIDE_ENV_VARS):
            return cls(address=address, headers=auth_headers(token), request_timeout=timeout)
        with _env_lock:
            saved = {k: os.environ.pop(k) for k in _ADDRESS_OVERRIDE_ENV_VARS if k in os.environ}
            try:
                return cls(address=address, headers=auth_headers(token), request_timeout=timeout)
            finally:
                os.environ.update(saved)
    except Exception as exc:
        raise LaunchError(f"Cannot use the Ray dashboard at {address}: {_describe(exc)}") from exc


def clean_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """The job spec's runtime_env reduced to the keys we support, without empty values.

    Ray treats e.g. ``"pip": []`` as a (no-op) pip environment that still costs a setup step.
    """
    runtime_env = runtime_env or {}
    return {k: runtime_env[k] for k in RUNTIME_ENV_KEYS if runtime_env.get(k)}


def upload_packages(
    client: JobSubmissionClient, runtime_env: dict[str, Any], packages: dict[str, str]
) -> dict[str, Any]:
    """``runtime_env`` with a Manta package as working_dir replaced by the package uploaded to
    the cluster's GCS, the way Ray's own client ships a local directory (``gcs://`` URI)."""
    path = packages.get(runtime_env.get("working_dir") or "")
    if path is None:
        return runtime_env
    try:
        uri = client._upload_package_if_needed(path, include_gitignore=False, is_file=True)
    except Exception as exc:
        raise LaunchError(
            f"Uploading the code package to the cluster failed: {_describe(exc)}"
        ) from exc
    return {**runtime_env, "working_dir": uri}


def submit_idempotent(
    client: JobSubmissionClient,
    *,
    submission_id: str,
    entrypoint: str,
    runtime_env: dict[str, Any] | None = None,
    packages: dict[str, str] | None = None,
    entrypoint_num_cpus: float = 0,
    entrypoint_num_gpus: float = 0,
    entrypoint_memory: int = 0,
    metadata: dict[str, str] | None = None,
) -> bool:
    """Submit the entrypoint as Ray job ``submission_id``; True if this call created the job.

    Ray refuses a second job with the same submission_id, which is what makes a retried submit
    safe: when the submission fails and a job with this id exists, that job (started by an
    earlier try whose answer we never saw) is adopted and False is returned. A job with this id
    but a different entrypoint is not ours to adopt and raises LaunchError.
    """
    runtime_env = upload_packages(client, clean_runtime_env(runtime_env), packages or {})
    try:
        client.submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env=runtime_env or None,
            entrypoint_num_cpus=entrypoint_num_cpus,
            entrypoint_num_gpus=entrypoint_num_gpus or None,
            entrypoint_memory=entrypoint_memory or None,
            metadata=metadata or None,
        )
        return True
    except Exception as exc:
        submit_error = exc
    existing = _job_details(client, submission_id)
    if existing is None:
        raise LaunchError(
            f"Submitting Ray job {submission_id} failed: {_describe(submit_error)}"
        ) from submit_error
    if existing.entrypoint != entrypoint:
        raise JobConflict(
            f"Ray job {submission_id} already exists with a different entrypoint "
            f"({existing.entrypoint!r}, not {entrypoint!r})"
        )
    logger.info("Ray job %s already exists; adopting it", submission_id)
    return False


def job_state(client: JobSubmissionClient, submission_id: str) -> RayJobState:
    """Ray's status, message and driver exit code for the job. LaunchError if it is unknown."""
    details = _job_details(client, submission_id)
    if details is None:
        raise LaunchError(f"Ray job {submission_id} does not exist on this cluster")
    status = getattr(details.status, "value", details.status)
    return RayJobState(
        status=str(status),
        message=details.message or "",
        # Ray >= 2.x reports the entrypoint's exit code once the driver has exited.
        exit_code=getattr(details, "driver_exit_code", None),
    )


def job_logs(client: JobSubmissionClient, submission_id: str, *, tail: int | None = None) -> str:
    """The job's driver log (its last ``tail`` lines when given)."""
    try:
        text = client.get_job_logs(submission_id)
    except Exception as exc:
        raise LaunchError(
            f"Reading the logs of Ray job {submission_id} failed: {_describe(exc)}"
        ) from exc
    return tail_lines(text, tail)


def follow_logs(client: JobSubmissionClient, submission_id: str) -> Iterator[str]:
    """The job's driver log from its start, chunk by chunk as the driver writes it, until the
    job ends (Ray's websocket tail: nothing is read whole). LaunchError when the cluster stops
    answering before that."""
    loop = asyncio.new_event_loop()
    chunks = client.tail_job_logs(submission_id)
    try:
        while True:
            try:
                yield loop.run_until_complete(chunks.__anext__())
            except StopAsyncIteration:
                return
            except Exception as exc:
                raise LaunchError(
                    f"Following the logs of Ray job {submission_id} failed: {_describe(exc)}"
                ) from exc
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(chunks.aclose())
        loop.close()


def stop_job(client: JobSubmissionClient, submission_id: str) -> bool:
    """Ask Ray to stop the job; True if it was still running. A missing job is not an error."""
    try:
        return bool(client.stop_job(submission_id))
    except Exception as exc:
        if _job_details(client, submission_id) is None:
            return False
        raise LaunchError(f"Stopping Ray job {submission_id} failed: {_describe(exc)}") from exc


def wait_for_terminal(
    client: JobSubmissionClient,
    submission_id: str,
    *,
    timeout: float,
    poll_interval: float = 0.5,
) -> RayJobState:
    """Poll until the job is SUCCEEDED, FAILED or STOPPED; LaunchError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        state = job_state(client, submission_id)
        if state.status in RAY_TERMINAL:
            return state
        if time.monotonic() >= deadline:
            raise LaunchError(f"Ray job {submission_id} still {state.status} after {timeout:.0f}s")
        time.sleep(poll_interval)


def tail_lines(text: str, tail: int | None) -> str:
    """The last ``tail`` lines of ``text`` (all of it when ``tail`` is None)."""
    if tail is None:
        return text
    if tail <= 0:
        return ""
    return "".join(text.splitlines(keepends=True)[-tail:])


def _job_details(client: JobSubmissionClient, submission_id: str) -> Any | None:
    """The job's JobDetails, or None when the cluster has no such job."""
    try:
        return client.get_job_info(submission_id)
    except Exception as exc:
        # Ray answers an unknown id with 404, surfaced only as text in a RuntimeError.
        if "404" in str(exc) or "does not exist" in str(exc):
            return None
        raise LaunchError(f"Asking Ray about job {submission_id} failed: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # Ray's auth errors append a long how-to-configure-tokens paragraph; the first line says it.
    return text.splitlines()[0] if len(text) > 500 else text

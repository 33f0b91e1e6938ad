"""Helpers for talking to one Ray cluster's Jobs API (the dashboard) with a bearer token.

Shared by every launcher that ends up with a dashboard URL and a token (``local``, ``ray``), so
nothing here knows how the cluster came to be. What these helpers promise:

* :func:`make_client` talks to exactly the address it is given (Ray would otherwise let
  ``RAY_ADDRESS``/``RAY_API_SERVER_ADDRESS`` in this process's environment silently redirect it),
  sends ``Authorization: Bearer <token>`` on every request, and sends every request (the
  version check in the constructor included) through :func:`.dashboard_http.exchange`: a total
  deadline, no redirects and a size cap on each answer, since the job may have replaced the
  dashboard with a server of its own.
* Text from the cluster (status messages, logs) comes back clean (:mod:`.cluster_text`).
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
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import cluster_text, dashboard_http
from .base import RAY_TERMINAL, LaunchError, LogPart, RayJobState

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

logger = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = dashboard_http.DEFAULT_TIMEOUT  # seconds, total, per request
ANSWER_LIMIT = dashboard_http.ANSWER_LIMIT  # bytes of a JSON answer
LOG_ANSWER_LIMIT = 4 * ANSWER_LIMIT  # bytes of the Jobs API's answer with a whole log
UPLOAD_SECONDS_PER_MIB = 1.0  # a package upload's deadline grows with its size

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

    class _BoundedJobSubmissionClient(JobSubmissionClient):
        """A JobSubmissionClient whose every HTTP request is one dashboard_http.exchange():
        a total deadline, no redirects, a size cap on the answer.

        Ray's public methods take no timeout, and a dashboard that accepts the connection but
        never answers (or drips its answer) would otherwise hang a Celery task forever.
        """

        def __init__(
            self,
            *args: Any,
            request_timeout: float,
            answer_limit: int,
            log_limit: int,
            **kwargs: Any,
        ) -> None:
            # Set before super().__init__, which already sends the version-check requests.
            self._request_timeout = request_timeout
            self._answer_limit = answer_limit
            self._log_limit = log_limit
            self._version_answer: Any = None
            super().__init__(*args, **kwargs)

        def _do_request(
            self,
            method: str,
            endpoint: str,
            *,
            data: bytes | None = None,
            json_data: dict | None = None,
            **kwargs: Any,
        ) -> Any:
            # The constructor checks the version twice, with the same request: ask once.
            if method == "GET" and endpoint == "/api/version" and self._version_answer:
                return self._version_answer
            headers = dict(self._headers)
            body = data
            if json_data is not None:
                body = json.dumps(json_data).encode()
                headers["Content-Type"] = "application/json"
            timeout = self._request_timeout + len(body or b"") / 2**20 * UPLOAD_SECONDS_PER_MIB
            limit = self._log_limit if endpoint.endswith("/logs") else self._answer_limit
            url = self._address + endpoint
            answer = dashboard_http.exchange(
                method,
                url,
                headers=headers,
                body=body,
                timeout=timeout,
                limit=limit,
                verify=self._verify,
            )
            if answer.status in (401, 403):
                raise dashboard_http.DashboardError(
                    f"{method} {url} answered {answer.status}: the cluster's token was "
                    f"{'refused' if answer.status == 403 else 'not sent'}"
                )
            response = _response(answer, url)
            if method == "GET" and endpoint == "/api/version" and answer.status == 200:
                self._version_answer = response
            return response

    return _BoundedJobSubmissionClient


def _response(answer: dashboard_http.Answer, url: str) -> Any:
    """The answer as the ``requests.Response`` Ray's client reads (status, text, json())."""
    import requests

    response = requests.Response()
    response.status_code = answer.status
    response.reason = answer.reason
    response.headers = requests.structures.CaseInsensitiveDict(answer.headers)
    response.url = url
    response.encoding = "utf-8"  # never guessed: a guess reads the whole body once more
    response._content = answer.body
    response._content_consumed = True
    return response


def make_client(
    address: str,
    token: str | None,
    *,
    timeout: float = DEFAULT_REQUEST_TIMEOUT,
    answer_limit: int = ANSWER_LIMIT,
    log_limit: int = LOG_ANSWER_LIMIT,
) -> JobSubmissionClient:
    """A ``JobSubmissionClient`` for the dashboard at ``address`` (``http://host:port``).

    Each of its requests ends within ``timeout`` seconds (a package upload gets
    UPLOAD_SECONDS_PER_MIB more per MiB), follows no redirect, and accepts an answer of at most
    ``answer_limit`` bytes (``log_limit`` for a whole driver log). Raises LaunchError when the
    dashboard is unreachable, rejects the token or answers outside those bounds.
    """
    cls = _client_class()
    options = {
        "address": address,
        "headers": auth_headers(token),
        "request_timeout": timeout,
        "answer_limit": answer_limit,
        "log_limit": log_limit,
    }
    try:
        if not any(k in os.environ for k in _ADDRESS_OVERRIDE_ENV_VARS):
            return cls(**options)
        with _env_lock:
            saved = {k: os.environ.pop(k) for k in _ADDRESS_OVERRIDE_ENV_VARS if k in os.environ}
            try:
                return cls(**options)
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
    # Ray >= 2.x reports the entrypoint's exit code once the driver has exited.
    exit_code = getattr(details, "driver_exit_code", None)
    return RayJobState(
        status=cluster_text.clean(str(status))[:16],
        message=cluster_text.clean(details.message or ""),
        # A dashboard that is not Ray's may say anything: only what an int column holds.
        exit_code=exit_code if isinstance(exit_code, int) and abs(exit_code) < 2**31 else None,
    )


def _whole_log(client: JobSubmissionClient, submission_id: str) -> str:
    try:
        text = client.get_job_logs(submission_id)
    except Exception as exc:
        raise LaunchError(
            f"Reading the logs of Ray job {submission_id} failed: {_describe(exc)}"
        ) from exc
    if not isinstance(text, str):
        raise LaunchError(f"The logs of Ray job {submission_id} are not text")
    return cluster_text.clean(text)


def job_logs(
    client: JobSubmissionClient,
    submission_id: str,
    *,
    tail: int | None = None,
    limit: int = LOG_ANSWER_LIMIT,
) -> str:
    """The job's driver log (its last ``tail`` lines when given), at most its last ``limit``
    bytes. The Jobs API answers only with the whole log: one longer than the client's
    ``log_limit`` raises LaunchError."""
    text = _whole_log(client, submission_id)
    return tail_lines(cluster_text.part_of(text, since=None, limit=limit).text, tail)


def log_part(
    client: JobSubmissionClient, submission_id: str, *, since: int | None = None, limit: int
) -> LogPart:
    """At most ``limit`` bytes of the job's driver log, from byte ``since`` on when given,
    else its end (cut from the whole log, the one answer the Jobs API has)."""
    return cluster_text.part_of(_whole_log(client, submission_id), since=since, limit=limit)


def follow_logs(client: JobSubmissionClient, submission_id: str) -> Iterator[str]:
    """The job's driver log from its start, chunk by chunk as the driver writes it, until the
    job ends (Ray's websocket tail: nothing is read whole). LaunchError when the cluster stops
    answering before that."""
    loop = asyncio.new_event_loop()
    chunks = client.tail_job_logs(submission_id)
    try:
        while True:
            try:
                yield cluster_text.clean(loop.run_until_complete(chunks.__anext__()))
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
    except LaunchError:
        raise  # no answer (or one out of bounds): that says nothing about the job
    except Exception as exc:
        # Ray answers an unknown id with 404, surfaced only as text in a RuntimeError.
        if "404" in str(exc) or "does not exist" in str(exc):
            return None
        raise LaunchError(f"Asking Ray about job {submission_id} failed: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # Ray's errors may carry a long paragraph or a whole answer; the first line says it.
    return text.splitlines()[0][:500] if len(text) > 500 else text

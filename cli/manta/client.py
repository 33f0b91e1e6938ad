"""A thin, typed client for the Manta API.

    from manta import Client

    with Client("https://manta.example", token="mnt_…", org="acme", workspace="ml") as manta:
        job = manta.submit_job(template=7, name="nightly")
        print(manta.job(job["id"])["state"])

Every method is one request (lists follow the pages) and returns the API's JSON; an error
answer raises :class:`manta.errors.ApiError`. A POST that creates something sends an
``Idempotency-Key``, so it is retried after a lost connection without creating twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, cast

import httpx

from . import __version__
from .errors import ApiError, ConnectionFailed
from .responses import Job, JobLogs, Package, Template, Token

JsonDict = dict[str, Any]
# Answers worth asking again for a request that is safe to repeat.
RETRY_STATUSES = frozenset({502, 503, 504})
MAX_PAGE_SIZE = 200


class Client:
    """One API user (``token``) on one Manta (``url``); ``org`` and ``workspace`` are where the
    workspace-level methods act."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        org: str | None = None,
        workspace: str | None = None,
        timeout: float = 30.0,
        retries: int = 2,
        transport: httpx.BaseTransport | None = None,
    ):
        self.url = url.rstrip("/")
        self.org = org
        self.workspace = workspace
        self.retries = retries
        headers = {"User-Agent": f"manta-cli/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1/", headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- identity ---------------------------------------------------------------------------

    def create_token(
        self, *, email: str, password: str, name: str = "", expires_in_days: int | None = None
    ) -> Token:
        """A new API token for the user with these credentials (its secret is in ``token``)."""
        body = {"email": email, "password": password, "name": name}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        return cast(Token, self._create("auth/tokens/", json=body))

    def revoke_token(self, token_id: int) -> None:
        self._request("DELETE", f"auth/tokens/{token_id}/")

    def me(self) -> JsonDict:
        return self._get("me/")

    def orgs(self) -> list[JsonDict]:
        return list(self._pages("orgs/"))

    def org_detail(self, org: str | None = None) -> JsonDict:
        return self._get(f"orgs/{org or self._org()}/")

    def workspaces(self, org: str | None = None) -> list[JsonDict]:
        return list(self._pages(f"orgs/{org or self._org()}/workspaces/"))

    def workspace_detail(self, org: str | None = None, workspace: str | None = None) -> JsonDict:
        return self._get(f"orgs/{org or self._org()}/workspaces/{workspace or self._ws()}/")

    # --- templates --------------------------------------------------------------------------

    def templates(self) -> list[Template]:
        return cast(list[Template], list(self._pages(self._ws_path("templates/"))))

    def template(self, template_id: int) -> Template:
        return cast(Template, self._get(self._ws_path(f"templates/{template_id}/")))

    def find_template(self, name: str) -> Template | None:
        """The workspace's template called ``name`` (None when there is none)."""
        return next((t for t in self.templates() if t.get("name") == name), None)

    # --- jobs -------------------------------------------------------------------------------

    def jobs(
        self,
        *,
        state: str | list[str] | None = None,
        template: int | None = None,
        submitter: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        limit: int | None = 50,
    ) -> list[Job]:
        """The workspace's jobs, newest first as the API orders them; ``limit=None`` for all."""
        params: dict[str, Any] = {
            "state": [state] if isinstance(state, str) else state,
            "template": template,
            "submitter": submitter,
            "created_after": created_after,
            "created_before": created_before,
        }
        return cast(list[Job], list(self._pages(self._ws_path("jobs/"), params, limit=limit)))

    def job(self, job_id: int) -> Job:
        return cast(Job, self._get(self._ws_path(f"jobs/{job_id}/")))

    def submit_job(
        self,
        *,
        template: int | None = None,
        spec: Mapping[str, Any] | None = None,
        name: str = "",
        overrides: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        include_position: bool = False,
    ) -> Job:
        """Submit from a template (its id, with ``overrides``) or, where the workspace allows
        ad-hoc jobs, from a whole ``spec``. Sending the same ``idempotency_key`` again returns
        the first job instead of a second one. The answer's ``queue`` (place in the queue,
        predicted start) is null unless ``include_position``: the service reads the queue to
        work it out, which a submission does not pay for unless asked."""
        body = _submission(template, spec, name, overrides)
        path = self._ws_path("jobs/")
        params = {"include": "position"} if include_position else None
        return cast(
            Job, self._create(path, json=body, params=params, idempotency_key=idempotency_key)
        )

    def dry_run_job(
        self,
        *,
        template: int | None = None,
        spec: Mapping[str, Any] | None = None,
        name: str = "",
        overrides: Mapping[str, Any] | None = None,
    ) -> JsonDict:
        """What :meth:`submit_job` with these arguments would do now, creating nothing: whether
        the job would be admitted at once, its place in the queue, what it would wait for
        (``blocker``) and its predicted start (``predicted_start``: ``p50``, ``p90``). Bad input
        raises the same :class:`ApiError` a submission would."""
        body = _submission(template, spec, name, overrides)
        path = self._ws_path("jobs/")
        return self._request("POST", path, params={"dry_run": "true"}, json=body, retry=True).json()

    def cancel_job(self, job_id: int, reason: str = "") -> Job:
        return cast(Job, self._post(self._ws_path(f"jobs/{job_id}/cancel/"), {"reason": reason}))

    def approve_job(self, job_id: int, reason: str = "") -> Job:
        return cast(Job, self._post(self._ws_path(f"jobs/{job_id}/approve/"), {"reason": reason}))

    def reject_job(self, job_id: int, reason: str) -> Job:
        return cast(Job, self._post(self._ws_path(f"jobs/{job_id}/reject/"), {"reason": reason}))

    def job_events(self, job_id: int) -> list[JsonDict]:
        return list(self._pages(self._ws_path(f"jobs/{job_id}/events/")))

    def job_logs(
        self,
        job_id: int,
        *,
        since: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
    ) -> JobLogs:
        """The driver log of the latest attempt (or ``attempt``). Pass the answer's ``offset``
        back as ``since`` to get only what was written after it."""
        params = {"since": since, "attempt": attempt, "tail": tail}
        return cast(JobLogs, self._get(self._ws_path(f"jobs/{job_id}/logs/"), params))

    # --- quota ------------------------------------------------------------------------------

    def quota(self) -> JsonDict:
        return self._get(self._ws_path("quota/"))

    def usage(self) -> JsonDict:
        return self._get(self._ws_path("usage/"))

    # --- code packages ----------------------------------------------------------------------

    def package(self, sha256: str) -> Package | None:
        """The workspace's package with this content, or None when it has not been uploaded.
        A server without the packages endpoint raises :class:`ApiError` (type ``http_error``)."""
        try:
            return cast(Package, self._get(self._ws_path(f"packages/{sha256}/")))
        except ApiError as exc:
            if exc.status == 404 and exc.is_api_body:
                return None
            raise

    def upload_package(self, data: bytes, *, idempotency_key: str | None = None) -> Package:
        """Upload a zip; answers the package (``uri`` is what ``runtime_env.working_dir`` takes),
        the same one when this content is there already."""
        return cast(
            Package,
            self._create(
                self._ws_path("packages/"),
                content=data,
                headers={"Content-Type": "application/zip"},
                idempotency_key=idempotency_key,
            ),
        )

    # --- code sources -----------------------------------------------------------------------

    def code_sources(self) -> list[JsonDict]:
        """The workspace's git code sources (``spec.code.source`` names one)."""
        return list(self._pages(self._ws_path("code-sources/")))

    # --- plumbing ---------------------------------------------------------------------------

    def _org(self) -> str:
        if not self.org:
            raise ValueError("no organisation chosen: pass org= (manta context --org ORG)")
        return self.org

    def _ws(self) -> str:
        if not self.workspace:
            raise ValueError("no workspace chosen: pass workspace= (manta context --workspace W)")
        return self.workspace

    def _ws_path(self, rest: str) -> str:
        return f"orgs/{self._org()}/workspaces/{self._ws()}/{rest}"

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> JsonDict:
        return self._request("GET", path, params=params, retry=True).json()

    def _post(self, path: str, body: JsonDict) -> JsonDict:
        # A state change is not retried: a second try after a lost answer could be refused as
        # an invalid transition although the first one worked.
        return self._request("POST", path, json=body).json()

    def _create(
        self,
        path: str,
        *,
        idempotency_key: str | None = None,
        headers: dict[str, str] | None = None,
        **body: Any,
    ) -> JsonDict:
        headers = {**(headers or {}), "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        return self._request("POST", path, headers=headers, retry=True, **body).json()

    def _pages(
        self, path: str, params: Mapping[str, Any] | None = None, *, limit: int | None = None
    ) -> Iterator[JsonDict]:
        """Every row of a list, page by page. A list that hands out cursors (jobs, a job's
        events) is followed by cursor after its first page: each page then costs the service
        what the first did, however deep, and rows added meanwhile are not shown twice."""
        returned = 0
        page_size = min(limit, MAX_PAGE_SIZE) if limit else MAX_PAGE_SIZE
        where: dict[str, Any] = {"page": 1}
        while True:
            body = self._get(path, {**(params or {}), **where, "page_size": page_size})
            if isinstance(body, list):  # an endpoint without pagination
                yield from body[:limit] if limit else body
                return
            for item in body.get("results", []):
                if limit is not None and returned >= limit:
                    return
                returned += 1
                yield item
            if not body.get("next") or (limit is not None and returned >= limit):
                return
            link = body.get("next_cursor") or ("cursor" in where and body["next"])
            if link:
                where = {"cursor": httpx.URL(link).params["cursor"]}
            else:
                where = {"page": where["page"] + 1}

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        retry: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        if params:
            params = {key: value for key, value in params.items() if value is not None}
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.request(method, path, params=params, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise ConnectionFailed(f"{self.url}: {exc or type(exc).__name__}") from exc
            else:
                if last or response.status_code not in RETRY_STATUSES:
                    if response.is_error:
                        raise ApiError.from_response(response)
                    return response
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


def _submission(
    template: int | None,
    spec: Mapping[str, Any] | None,
    name: str,
    overrides: Mapping[str, Any] | None,
) -> JsonDict:
    if (template is None) == (spec is None):
        raise ValueError("give either template or spec")
    body: JsonDict = {"template": template} if template is not None else {"spec": spec}
    if name:
        body["name"] = name
    if overrides:
        body["overrides"] = dict(overrides)
    return body

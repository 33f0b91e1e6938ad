"""The org admins' console in a real headless browser (Debian's Chromium driven by Playwright)
against the API under gunicorn with DEBUG off, a real Celery worker and one real local Ray
cluster: an org admin logs in, the admin is styled by Manta's stylesheet (served by WhiteNoise),
the overview shows usage bars and charts, the approvals inbox approves one job and rejects
another with a typed reason, the job page shows the attempt and the log lines of a job that ran,
/api/docs/ renders every operation with no network beyond this host, and a developer signs in
and opens a running job's Ray Dashboard through Manta (another tenant's gets a 404, and the
dashboard's job submission API is refused).

Screenshots go to ``$MANTA_ARTIFACTS_DIR`` (``var/artifacts/screenshots`` by default), for CI to
keep. The module's data is built once (``console``) and the tests read it in order; everything
is read back over HTTP, as a browser or a client would.

The dashboard step needs a job that is still running: the ``running_job`` fixture starts a
second cluster for it, before the inbox queues a job that may never start (the organisation's
queue is FIFO, so nothing queued after it would start).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from jobs.models import JobEvent
from quotas.models import Reservation
from tests.conftest import PASSWORD, World, build_world
from tests.e2e.conftest import ROOT
from tests.e2e.servers import Api, wait_until
from tests.factories import (
    JobEventFactory,
    JobFactory,
    OrgQuotaFactory,
    QuotaGroupFactory,
    ReservationFactory,
    WorkspaceFactory,
    WorkspaceMembershipFactory,
    WorkspaceQuotaFactory,
)

# django_db: so the test database is set up for the module's fixtures (the tests themselves only
# talk HTTP to the servers; what they write in-process would be rolled back, and they write none).
pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.django_db]

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ORG = "/api/v1/orgs/acme/"
KNOWN_LINE = "manta console says hello"
HOSTILE_LINE = "<b>not bold</b><script>document.title='owned'</script>"
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
REJECT_REASON = "needs a data-protection review before it may read customer data"


def artifacts() -> Path:
    path = Path(os.environ.get("MANTA_ARTIFACTS_DIR") or ROOT / "var" / "artifacts" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def py(code: str) -> str:
    return 'python -c "' + code.replace('"', '\\"') + '"'


@dataclasses.dataclass
class Console:
    api: Api
    world: World
    ran: int  # a job that ran on a real cluster (approved through the API)
    to_approve: int  # two jobs waiting in the inbox, in a workspace that runs nothing
    to_reject: int

    def get(self, who: str, path: str) -> dict:
        response = self.api.call(self.world.tokens[who], "GET", path)
        assert response.status_code == 200, response.text
        return response.json()


def server_env(var: Path) -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "false",
        # Plain HTTP on loopback: the session cookie must travel without TLS here.
        "MANTA_SECURE_COOKIES": "false",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "SECRET_KEY": settings.SECRET_KEY,  # the worker's: launcher handles decrypt alike
        "MANTA_VAR_DIR": str(var),
        "PYTHONUNBUFFERED": "1",
    }


def template(api: Api, token: str, ws: str, name: str, entrypoint: str, **spec) -> int:
    body = {
        "name": name,
        "image": "rayproject/ray:2.60.0",
        "entrypoint": entrypoint,
        "head": {"cpu": 0, "memory_gb": 1},
        "worker_groups": [],
        "max_runtime_seconds": 120,
        **spec,
    }
    response = api.call(token, "POST", f"{ORG}workspaces/{ws}/templates/", body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def submit(api: Api, token: str, ws: str, template_id: int, name: str) -> int:
    body = {"template": template_id, "name": name}
    response = api.call(token, "POST", f"{ORG}workspaces/{ws}/jobs/", body)
    assert response.status_code == 201, response.text
    assert response.json()["state"] == "pending_approval"
    return response.json()["id"]


def past_week(ws) -> None:
    """Jobs that queued, ran and ended over the last days (rows as the services leave them,
    backdated), so the overview's charts have a history to draw."""
    now = timezone.now()
    for day in range(6, 0, -1):
        for n, (cpu, gpu) in enumerate(((4, 1), (2, 0), (6, 1))[: 1 + day % 3]):
            start = now - dt.timedelta(days=day, hours=3 * n)
            job = JobFactory(workspace=ws, state="succeeded", finished_at=start)
            held = ReservationFactory(job=job, cpu=cpu, memory_gb=cpu * 2, gpu=gpu)
            Reservation.objects.filter(pk=held.pk).update(
                created_at=start, released_at=start + dt.timedelta(hours=2 + n + day % 2)
            )
            for at, before, after in ((-1.5 * (n + 1), "", "queued"), (0, "queued", "launching")):
                event = JobEventFactory(job=job, from_state=before, to_state=after)
                JobEvent.objects.filter(pk=event.pk).update(
                    created_at=start + dt.timedelta(hours=at)
                )


@pytest.fixture(scope="module")
def console(worker, django_db_blocker, tmp_path_factory):
    """Acme with a quota and two workspaces that need approval for every job: in ``ml`` a job
    that prints a known line (approved at once, so it runs while the first tests do); in
    ``research`` (which may run no job at all, so approving there starts no cluster) two jobs
    left for the inbox. Everything is committed; the database is emptied at the end."""
    with django_db_blocker.unblock():
        world = build_world()
        research = WorkspaceFactory(organization=world.org, slug="research", name="Research")
        WorkspaceMembershipFactory(workspace=research, user=world.users["developer"])
        OrgQuotaFactory(organization=world.org, cpu=16, memory_gb=64, gpu=2, max_running_jobs=4)
        division = QuotaGroupFactory(
            organization=world.org, name="applied-ml", guaranteed_cpu=3, limit_cpu=12
        )  # a group above ml, whose limits bind nothing ml's own do not
        WorkspaceQuotaFactory(
            workspace=world.ws, guaranteed_cpu=2, limit_cpu=8, limit_memory_gb=32,
            gpu_hours_per_month=50, group=division,
        )  # fmt: skip
        WorkspaceQuotaFactory(workspace=research, guaranteed_cpu=1, max_running_jobs=0)
        past_week(world.ws)
        # The server checks passwords with the production hashers (the tests' settings use MD5).
        for who in ("org_admin", "developer", "foreign"):
            user = world.users[who]
            user.password = PBKDF2PasswordHasher().encode(PASSWORD, "console-e2e-salt")
            user.save(update_fields=["password"])
        for ws in (world.ws, research):
            ws.approval_policy = "always"
            ws.save(update_fields=["approval_policy"])
    var = tmp_path_factory.mktemp("console-api")
    api = Api(server_env(var), var / "api.log")
    api.start()
    try:
        owner, developer = world.tokens["owner"], world.tokens["developer"]
        code = f"print({KNOWN_LINE!r}, flush=True); print({HOSTILE_LINE!r}, flush=True)"
        ran = submit(api, developer, "ml", template(api, owner, "ml", "prints", py(code)), "prints")
        approved = api.call(
            world.tokens["org_admin"], "POST", f"{ORG}workspaces/ml/jobs/{ran}/approve/"
        )
        assert approved.status_code == 200, approved.text
        waiting = template(api, owner, "research", "sweeps", "python -c 'print(1)'")
        to_approve = submit(api, developer, "research", waiting, "sweep-small")
        to_reject = submit(api, developer, "research", waiting, "sweep-customer-data")
        yield Console(api, world, ran, to_approve, to_reject)
    finally:
        api.stop()
        with django_db_blocker.unblock():
            for connection in connections.all():
                connection.close()
            call_command("flush", interactive=False, verbosity=0)
            connections.close_all()


@pytest.fixture(scope="module")
def running_job(console):
    """A job that sleeps on its own cluster in ``ml`` until the module ends (then cancelled):
    for the step where a developer opens its Ray Dashboard through Manta. Its id, once running."""
    owner, developer = console.world.tokens["owner"], console.world.tokens["developer"]
    api = console.api
    template_id = template(api, owner, "ml", "sleeps", py("import time; time.sleep(60)"))
    job = submit(api, developer, "ml", template_id, "sleeps")
    api.call(console.world.tokens["org_admin"], "POST", f"{ORG}workspaces/ml/jobs/{job}/approve/")
    path = f"{ORG}workspaces/ml/jobs/{job}/"
    wait_until(
        lambda: console.get("developer", path)["state"] == "running",
        120,
        lambda: f"{path}: {console.get('developer', path)}",
    )
    yield job
    api.call(owner, "POST", f"{path}cancel/", {"reason": "the module is done"})

    def torn_down() -> bool:
        attempts = console.get("developer", path)["attempts"]
        return all(attempt["torn_down_at"] for attempt in attempts)

    wait_until(torn_down, 60, lambda: f"job {job}'s cluster is still up")


@pytest.fixture(scope="module")
def browser(django_db_blocker):
    # Playwright's sync API keeps an asyncio loop running in this thread, which Django takes for
    # an async context; the test's own database calls (pytest-django's) are plain sync calls.
    with pytest.MonkeyPatch.context() as patch, sync_api.sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()
        # Django's connections belong to the context they were opened in, and Playwright's loop
        # makes one of its own: close the tests' connection here, where it was opened.
        with django_db_blocker.unblock():
            connections.close_all()


def log_in(browser, console: Console, email: str = "admin@acme.test"):
    """A new browser context logged in at /admin/login/ (through the form, as a person would),
    and its page."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{console.api.base}/admin/login/")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_load_state()
    assert page.url == f"{console.api.base}/admin/", page.inner_text("body")[:2000]
    return page


def shoot(page, name: str) -> None:
    page.screenshot(path=str(artifacts() / f"{name}.png"), full_page=True)


def test_login_page_and_admin_are_styled_by_manta(console, browser):
    context = browser.new_context()
    page = context.new_page()
    styles = []
    page.on(
        "response", lambda r: styles.append((r.url, r.status)) if r.url.endswith(".css") else None
    )
    page.goto(f"{console.api.base}/admin/login/")
    shoot(page, "login")
    served = dict(styles)
    manta_css = f"{console.api.base}/static/manta/console.css"
    assert served.get(manta_css) == 200, served
    assert served.get(f"{console.api.base}/static/admin/css/base.css") == 200, served
    header = page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor")
    assert header == "rgb(11, 46, 69)"  # Manta's deep blue, from console.css
    assert "Manta console" in page.inner_text("#site-name")
    context.close()

    page = log_in(browser, console)
    assert page.locator("#manta-console").is_visible()
    assert page.locator("#manta-console").get_by_text("Acme").count() >= 1
    shoot(page, "index")
    page.context.close()


def sign_in(browser, console: Console, path: str, email: str):
    """A new browser context that opens ``path`` not signed in, is sent to the sign-in page
    (every user's, not the admin's), signs in there and is sent back; and its page."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(console.api.base + path)
    assert urlsplit(page.url).path == "/api-auth/login/", page.url
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("[type=submit]")
    page.wait_for_load_state()
    return page


def test_a_developer_opens_a_running_jobs_ray_dashboard_through_manta(
    console, browser, running_job
):
    job = f"{ORG}workspaces/ml/jobs/{running_job}/"
    [attempt] = console.get("developer", job)["attempts"]
    assert attempt["dashboard_url"] == f"{job}dashboard/"  # Manta's path, not the worker's
    page = sign_in(browser, console, f"{job}dashboard/#/jobs", "dev@acme.test")
    assert "/dashboard/-/" in page.url  # the session was traded for a dashboard link
    page.get_by_text(attempt["submission_id"]).first.wait_for(timeout=30_000)
    shoot(page, "ray-dashboard")
    # The page has an opaque origin: its scripts cannot use the developer's Manta session.
    assert page.evaluate("window.origin") == "null"
    reads = page.evaluate(
        "fetch('/api/v1/me/', {credentials: 'include'}).then(r => r.status, () => 'blocked')"
    )
    assert reads in ("blocked", 401, 403), reads
    # The dashboard's job submission API is refused, with the developer's own session.
    submitted = page.context.request.post(
        f"{console.api.base}{job}dashboard/api/jobs/", data={"entrypoint": "echo second job"}
    )
    assert submitted.status == 403, submitted.text()
    assert submitted.json()["type"] == "dashboard_read_only"
    jobs = page.context.request.get(f"{console.api.base}{job}dashboard/api/jobs/")
    assert [ray_job["submission_id"] for ray_job in jobs.json()] == [attempt["submission_id"]]
    page.context.close()

    # Another tenant, signed in, finds no such organisation (so no such job).
    page = sign_in(browser, console, f"{job}dashboard/", "owner@globex.test")
    body = page.inner_text("body")
    assert '"type":"not_found"' in body and "No such organisation." in body, body[:500]
    assert page.context.request.get(f"{console.api.base}{job}dashboard/").status == 404
    page.context.close()


def test_overview_shows_bars_and_charts(console, browser):
    page = log_in(browser, console)
    page.click("#manta-console a[href$='/overview/acme/']")
    page.wait_for_selector("#manta-overview")
    rows = page.locator("tr.manta-workspace")
    assert rows.count() == 2
    assert page.locator("tr[data-workspace=ml] svg.manta-bar").count() == 3  # cpu, memory, gpu
    assert page.locator("tr[data-workspace=research] .ws-pending").inner_text() == "2"
    assert page.locator("#card-pending .manta-figure").inner_text() == "2"
    charts = page.locator("#history .manta-chart svg")
    assert charts.count() == 3
    assert page.locator("#history polyline").count() == 3
    tree = page.locator("#quota-tree")  # the group, then ml under it, then research at the top
    assert tree.locator("tr").nth(1).get_attribute("data-node") == "group:applied-ml"
    assert tree.locator("tr[data-node='workspace:ml']").get_attribute("data-depth") == "1"
    assert tree.locator("tr[data-node='group:applied-ml'] svg.manta-bar").count() == 3
    box = charts.first.bounding_box()
    assert box["width"] > 200 and box["height"] > 30  # drawn, not collapsed
    shoot(page, "console-overview")
    page.context.close()


def test_inbox_approves_one_job_and_rejects_another_with_a_typed_reason(console, browser):
    page = log_in(browser, console)
    page.goto(f"{console.api.base}/admin/jobs/job/inbox/")
    shoot(page, "inbox")
    # Rejecting with no reason is refused, and nothing changes.
    page.check(f"#job-{console.to_reject}")
    page.click("#reject-selected")
    assert "a rejection needs a reason" in page.inner_text("#content-start")
    page.check(f"#job-{console.to_approve}")
    page.click("#approve-selected")
    page.wait_for_selector(".messagelist .success")
    page.check(f"#job-{console.to_reject}")
    page.fill("#id_reason", REJECT_REASON)
    page.click("#reject-selected")
    page.wait_for_selector("#inbox-empty")
    shoot(page, "inbox-decided")
    page.context.close()

    ws = f"{ORG}workspaces/research/"
    approved = console.get("developer", f"{ws}jobs/{console.to_approve}/")
    rejected = console.get("developer", f"{ws}jobs/{console.to_reject}/")
    assert approved["state"] == "queued"  # research may run nothing: it stays in the queue
    assert rejected["state"] == "rejected" and rejected["decision_reason"] == REJECT_REASON
    audit = console.get("owner", f"{ORG}audit-events/?action=job.reject")["results"]
    assert [e["metadata"]["reason"] for e in audit] == [REJECT_REASON]
    assert audit[0]["actor"]["label"] == "admin@acme.test"


def test_job_page_shows_the_attempt_and_its_log(console, browser):
    path = f"{ORG}workspaces/ml/jobs/{console.ran}/"
    wait_until(
        lambda: console.get("developer", path)["state"] in TERMINAL,
        180,
        lambda: f"job {console.ran}: {console.get('developer', path)['state']}",
        interval=1,
    )
    assert console.get("developer", path)["state"] == "succeeded"
    page = log_in(browser, console)
    page.goto(f"{console.api.base}/admin/jobs/job/{console.ran}/change/")
    assert page.inner_text("#job-state") == "succeeded"
    attempt = page.locator(".manta-attempt[data-attempt='1']")
    assert "succeeded" in attempt.inner_text()
    phases = attempt.locator(".manta-phases").inner_text()
    assert "cluster start" in phases and "run" in phases
    log = page.inner_text("#job-log pre")
    assert KNOWN_LINE in log
    assert HOSTILE_LINE in log  # shown as text: the tags are not markup
    assert page.locator("#job-log pre b").count() == 0
    assert page.title() != "owned"
    assert "its cluster and dashboard are gone" in page.inner_text("#job-dashboard")
    assert "approved" in page.inner_text("#job-timeline")
    shoot(page, "job")

    queued = f"{console.api.base}/admin/jobs/job/{console.to_approve}/change/"
    page.goto(queued)
    assert "in the queue" in page.inner_text("#job-waiting")
    page.context.close()


def test_api_docs_list_every_operation_with_no_network(console, browser):
    schema = yaml.safe_load(requests.get(f"{console.api.base}/api/schema/", timeout=30).content)
    methods = {"get", "post", "put", "patch", "delete"}
    operations = sum(1 for item in schema["paths"].values() for m in item if m in methods)
    context = browser.new_context()
    page = context.new_page()
    refused = []

    def only_this_host(route):
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_host)
    page.goto(f"{console.api.base}/api/docs/")
    page.wait_for_selector(".opblock", timeout=30_000)
    shown = page.locator(".opblock")
    wait_until(lambda: shown.count() == operations, 20, lambda: f"{shown.count()} of {operations}")
    summary = page.locator(".opblock-summary-path").all_inner_texts()
    assert any(re.search(r"/jobs/\{id\}/approve/", text) for text in summary), summary[:5]
    shoot(page, "api-docs")
    context.close()
    assert not refused, refused  # nothing outside this host was even asked for


def test_an_org_admin_turns_on_fair_share_preemption_on_the_quota_page(console, browser):
    """The quota page's box in a real browser: ticked alone, the services' rule refuses it and
    the page says why; with the policy and preemption it needs, it is saved. The organisation's
    queue is put back as it was for the module's other tests."""
    page = log_in(browser, console)
    page.goto(f"{console.api.base}/admin/quotas/orgquota/")
    page.click("#result_list tbody th a")  # Acme's quota, the one its admin sees
    page.check("#id_fair_share_preemption")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist li")
    shown = page.text_content(".messagelist").lower()
    assert "fair_share_preemption" in shown and "needs policy fair_share" in shown, shown
    quota = console.get("owner", f"{ORG}quota/")
    assert (quota["policy"], quota["fair_share_preemption"]) == ("fifo", False), quota

    page.select_option("#id_policy", "fair_share")
    page.check("#id_preemption")
    page.check("#id_fair_share_preemption")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    shoot(page, "quota-fair-share-preemption")
    page.context.close()
    quota = console.get("owner", f"{ORG}quota/")
    assert (quota["policy"], quota["preemption"], quota["fair_share_preemption"]) == (
        "fair_share",
        True,
        True,
    ), quota
    back = {"policy": "fifo", "preemption": False, "fair_share_preemption": False}
    restored = console.api.call(console.world.tokens["owner"], "PATCH", f"{ORG}quota/", back)
    assert restored.status_code == 200, restored.text

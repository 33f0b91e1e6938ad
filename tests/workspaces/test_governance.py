"""Rules that hold on every path: approval settings are the organisation's, an archived
workspace is read-only, and the admin panel refuses what the API refuses."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.test import Client

from audit.context import Actor
from jobs import services as job_services
from jobs.models import Job, JobTemplate
from tests.conftest import PASSWORD, SYSTEM
from tests.jobs.conftest import counter_spec
from workspaces import services
from workspaces.models import Workspace

WS = "/api/v1/orgs/acme/workspaces/ml/"


def row_counts() -> dict[str, int]:
    return {model._meta.label: model.objects.count() for model in apps.get_models()}


# --- approval settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body", [{"approval_policy": "auto"}, {"approval_thresholds": {"gpu": 8}}], ids=str
)
def test_a_workspace_admin_cannot_change_who_approves(world, body):
    world.ws.approval_policy = "always"
    world.ws.save()
    before = row_counts()
    response = world.client("ws_admin").patch(WS, body, format="json")
    assert response.status_code == 403, response.content
    field = next(iter(body))
    assert "organisation" in response.json()["errors"][field][0]
    world.ws.refresh_from_db()
    assert world.ws.approval_policy == "always" and row_counts() == before


def test_the_self_approval_bypass_is_closed(world):
    """The reported path: policy always → set auto → own job queued at once → set back."""
    world.ws.approval_policy = "always"
    world.ws.save()
    template = job_services.template_create(
        actor=SYSTEM, workspace=world.ws, name="t", spec=counter_spec()
    ).template
    admin = world.client("ws_admin")
    assert admin.patch(WS, {"approval_policy": "auto"}, format="json").status_code == 403
    submitted = admin.post(WS + "jobs/", {"template": template.pk}, format="json")
    assert submitted.status_code == 201
    assert submitted.json()["state"] == "pending_approval"
    own = admin.post(f"{WS}jobs/{submitted.json()['id']}/approve/", {}, format="json")
    assert own.status_code == 403


def test_org_admins_change_approval_settings(world):
    response = world.client("org_admin").patch(
        WS, {"approval_policy": "threshold", "approval_thresholds": {"gpu": 1}}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["approval_thresholds"] == {"gpu": 1}
    # A workspace admin may still edit the rest.
    renamed = world.client("ws_admin").patch(WS, {"name": "ML team"}, format="json")
    assert renamed.status_code == 200


# --- archived workspaces ----------------------------------------------------------------------


@pytest.fixture
def archived(world):
    template = job_services.template_create(
        actor=SYSTEM, workspace=world.ws, name="t", spec=counter_spec()
    ).template
    world.ws.approval_policy = "always"
    world.ws.save()
    pending = job_services.job_submit(
        actor=Actor.for_user(world.users["developer"]),
        workspace=world.ws,
        template=JobTemplate.objects.get(pk=template.pk),
    )
    services.workspace_archive(actor=SYSTEM, workspace=world.ws)
    return {"template": template.pk, "job": pending.pk}


WRITES = [
    ("POST", "jobs/", lambda ids: {"template": ids["template"]}),
    ("POST", "members/", lambda ids: {"email": "member@acme.test", "role": "viewer"}),
    ("POST", "templates/", lambda ids: {"name": "t2", **counter_spec()}),
    ("PATCH", "templates/{template}/", lambda ids: {"description": "x"}),
    (
        "POST",
        "webhooks/",
        lambda ids: {"url": "https://hooks.example.com/x", "event_types": ["job.succeeded"]},
    ),
    ("POST", "code-sources/", lambda ids: {"name": "s", "url": "https://github.com/acme/x.git"}),
    ("PATCH", "quota/", lambda ids: {"max_running_jobs": 3}),
    ("PATCH", "", lambda ids: {"name": "renamed"}),
    ("POST", "jobs/{job}/approve/", lambda ids: {}),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_an_archived_workspace_is_read_only(world, archived, method, path, body):
    before = row_counts()
    url = WS + path.format(**archived)
    response = getattr(world.client("owner"), method.lower())(url, body(archived), format="json")
    assert response.status_code == 409, (url, response.content)
    assert response.json()["type"] == "workspace_archived"
    assert row_counts() == before


def test_an_archived_workspace_is_still_readable_and_its_jobs_stoppable(world, archived):
    owner = world.client("owner")
    assert owner.get(WS + "jobs/").status_code == 200
    assert owner.get(WS).status_code == 200
    response = owner.post(f"{WS}jobs/{archived['job']}/cancel/", {}, format="json")
    assert response.status_code == 200, response.content
    assert Job.objects.get(pk=archived["job"]).state == "cancelled"


def test_services_refuse_writes_to_an_archived_workspace_too(world, archived):
    """The admin panel and commands call the services: they refuse as the API does."""
    from config.errors import DomainError

    with pytest.raises(DomainError, match="archived"):
        services.member_add(
            actor=SYSTEM, workspace=Workspace.objects.get(pk=world.ws.pk),
            email="member@acme.test", role="viewer",
        )  # fmt: skip


# --- the admin panel --------------------------------------------------------------------------


def admin_client() -> Client:
    client = Client()
    assert client.login(email="admin@acme.test", password=PASSWORD)
    return client


def admin_change(client, world, thresholds: str):
    return client.post(
        f"/admin/workspaces/workspace/{world.ws.pk}/change/",
        {
            "name": "ML",
            "description": "",
            "approval_policy": "threshold",
            "approval_thresholds": thresholds,
            "compute_target": "local",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )


@pytest.mark.parametrize("thresholds", ['{"cpu": "abc"}', '{"gpus": 1}', '{"cpu": -1}', "[1]"])
def test_the_admin_panel_refuses_what_the_api_refuses(world, thresholds):
    client = admin_client()
    before = row_counts()
    response = admin_change(client, world, thresholds)
    assert response.status_code == 200  # the form again, with the error
    assert "errorlist" in response.content.decode()
    world.ws.refresh_from_db()
    assert world.ws.approval_thresholds == {} and world.ws.approval_policy == "auto"
    assert row_counts() == before
    api = world.client("org_admin").patch(
        WS, {"approval_thresholds": __import__("json").loads(thresholds)}, format="json"
    )
    assert api.status_code == 400


def test_the_admin_panel_saves_valid_thresholds_and_submissions_keep_working(world):
    response = admin_change(admin_client(), world, '{"cpu": 4}')
    assert response.status_code == 302, response.content.decode()[:2000]
    world.ws.refresh_from_db()
    assert world.ws.approval_thresholds == {"cpu": 4}


def test_a_password_like_the_email_is_refused(world):
    invited = world.client("owner").post(
        "/api/v1/orgs/acme/invitations/", {"email": "jane.doe@acme.test"}, format="json"
    )
    body = {"token": invited.json()["token"], "password": "jane.doe@acme"}
    response = Client().post("/api/v1/invitations/accept/", body, content_type="application/json")
    assert response.status_code == 400
    assert "similar" in response.json()["errors"]["password"][0]


@pytest.mark.parametrize("permission", [None, "", "workspace.veiw"])
def test_a_view_must_name_a_permission_for_every_action(permission):
    from workspaces.api.tenancy import WorkspaceViewSet

    with pytest.raises(TypeError, match="permission_map names no permission"):
        type("Careless", (WorkspaceViewSet,), {"permission_map": {"list": permission}})

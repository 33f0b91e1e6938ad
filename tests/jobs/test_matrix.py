"""The tenant/role matrix over the template and job endpoints."""

import pytest

from audit.context import Actor
from jobs import services
from jobs.models import JobTemplate
from tests.conftest import SYSTEM
from tests.jobs.conftest import counter_spec
from tests.matrix import IN_ORG, WS_ADMINS, WS_VISIBLE, Case, check_case

WS = "/api/v1/orgs/{org}/workspaces/{ws}/"
SUBMITTERS = ("owner", "org_admin", "ws_admin", "developer")
APPROVERS = WS_ADMINS  # none of them submitted the job below


def a_template(world):
    version = services.template_create(
        actor=SYSTEM,
        workspace=world.ws,
        name="tpl",
        spec=counter_spec(),
        allowed_overrides=["priority"],
    )
    return {"template": version.template_id}


def a_pending_job(world):
    world.ws.approval_policy = "always"
    world.ws.save()
    template_id = a_template(world)["template"]
    job = services.job_submit(
        actor=Actor.for_user(world.users["developer"]),
        workspace=world.ws,
        template=JobTemplate.objects.get(pk=template_id),
    )
    return {"template": template_id, "job": job.pk}


CASES = [
    Case("templates_list", "GET", WS + "templates/", WS_VISIBLE),
    Case(
        "templates_create",
        "POST",
        WS + "templates/",
        WS_ADMINS,
        status=201,
        body=lambda w: {"name": "new", **counter_spec()},
        audit="template.create",
    ),
    Case("template_retrieve", "GET", WS + "templates/{template}/", WS_VISIBLE, params=a_template),
    Case(
        "template_versions",
        "GET",
        WS + "templates/{template}/versions/",
        WS_VISIBLE,
        params=a_template,
    ),
    Case(
        "template_update",
        "PATCH",
        WS + "templates/{template}/",
        WS_ADMINS,
        body={"priority": 7},
        audit="template.update",
        params=a_template,
    ),
    Case(
        "template_archive",
        "DELETE",
        WS + "templates/{template}/",
        WS_ADMINS,
        status=204,
        audit="template.archive",
        params=a_template,
    ),
    Case("jobs_list", "GET", WS + "jobs/", WS_VISIBLE),
    Case(
        "jobs_submit",
        "POST",
        WS + "jobs/",
        SUBMITTERS,
        status=201,
        audit="job.submit",
        body=lambda w: a_template(w),
    ),
    Case("job_retrieve", "GET", WS + "jobs/{job}/", WS_VISIBLE, params=a_pending_job),
    Case("job_events", "GET", WS + "jobs/{job}/events/", WS_VISIBLE, params=a_pending_job),
    Case(
        "job_approve",
        "POST",
        WS + "jobs/{job}/approve/",
        APPROVERS,
        audit="job.approve",
        params=a_pending_job,
        body={},
    ),
    Case(
        "job_reject",
        "POST",
        WS + "jobs/{job}/reject/",
        APPROVERS,
        audit="job.reject",
        params=a_pending_job,
        body={"reason": "no"},
    ),
    Case(
        "job_cancel",
        "POST",
        WS + "jobs/{job}/cancel/",
        SUBMITTERS,
        audit="job.cancel",
        params=a_pending_job,
        body={},
    ),
]


PRINCIPALS = [None, "foreign", *IN_ORG]


@pytest.mark.parametrize("who", PRINCIPALS, ids=lambda w: w or "anonymous")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matrix(world, case, who):
    check_case(world, case, who)

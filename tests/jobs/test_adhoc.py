"""Jobs without a template, where the workspace allows them: every rule of a template applies."""

from __future__ import annotations

import pytest

from jobs.models import Job

WS = "/api/v1/orgs/acme/workspaces/ml/"
SPEC = {
    "image": "rayproject/ray:2.60.0",
    "entrypoint": "python train.py",
    "head": {"cpu": 0, "memory_gb": 1},
    "worker_groups": [{"name": "workers", "replicas": 1, "cpu": 1, "memory_gb": 1}],
}


def allow_adhoc(world, on=True):
    response = world.client("ws_admin").patch(WS, {"adhoc_jobs": on}, format="json")
    assert response.status_code == 200 and response.json()["adhoc_jobs"] is on


def post(world, body, who="developer", **headers):
    return world.client(who).post(WS + "jobs/", body, format="json", **headers)


def test_a_workspace_runs_templates_only_unless_it_allows_adhoc_jobs(world):
    response = post(world, {"spec": SPEC})
    assert response.status_code == 400
    assert "adhoc_jobs is off" in response.json()["errors"]["spec"][0]
    allow_adhoc(world)
    response = post(world, {"spec": SPEC, "name": "try-1"})
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["template"], job["template_version"], job["name"]) == (None, None, "try-1")
    assert job["state"] == "queued" and job["spec"]["max_runtime_seconds"] > 0
    # What its sandboxes allow on the local host: per node at least 1 CPU, its memory + 30 %
    # object store + 1 GiB of Ray's own, 10 GB of disk.
    assert job["requested"] == pytest.approx(
        {"cpu": 2.0, "memory_gb": 2 * (1 + 0.3 + 1), "gpu": 0.0, "disk_gb": 20.0}
    )
    got = world.client("viewer").get(f"{WS}jobs/{job['id']}/")
    assert got.status_code == 200 and got.json()["template"] is None


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"image": "evil/miner:1"}, "spec.image", "image policy"),
        ({"runtime_env": {"working_dir": "/etc"}}, "spec.runtime_env.working_dir", "refused"),
        (
            {"worker_groups": [{"name": "w", "replicas": 10_000, "cpu": 1}]},
            "spec.worker_groups",
            "",
        ),
        ({"entrypoint": ""}, "spec.entrypoint", ""),
    ],
)
def test_every_rule_of_a_template_applies(world, change, field, rule):
    allow_adhoc(world)
    response = post(world, {"spec": {**SPEC, **change}})
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(key.startswith(field) for key in errors), errors
    assert rule in str(errors)
    assert not Job.objects.exists()


@pytest.mark.parametrize("value", ["maybe", "\x00", 10**20, {"on": True}])
def test_adhoc_jobs_takes_a_boolean_only(world, value):
    response = world.client("ws_admin").patch(WS, {"adhoc_jobs": value}, format="json")
    assert response.status_code == 400 and "adhoc_jobs" in response.json()["errors"]
    assert world.client("viewer").get(WS).json()["adhoc_jobs"] is False


def test_the_approval_policy_applies(world):
    allow_adhoc(world)
    policy = {"approval_policy": "threshold", "approval_thresholds": {"cpu": 0.5}}
    assert world.client("org_admin").patch(WS, policy, format="json").status_code == 200
    response = post(world, {"spec": SPEC})
    assert response.status_code == 201 and response.json()["state"] == "pending_approval"


def test_a_template_or_a_spec_not_both_and_nothing_to_override(world, template):
    allow_adhoc(world)
    both = post(world, {"template": template.pk, "spec": SPEC})
    assert both.status_code == 400 and "not both" in str(both.json()["errors"]["template"])
    neither = post(world, {})
    assert neither.status_code == 400 and "template" in neither.json()["errors"]
    overrides = post(world, {"spec": SPEC, "overrides": {"priority": 9}})
    assert overrides.status_code == 400 and "overrides" in overrides.json()["errors"]
    assert not Job.objects.exists()


def test_a_retried_adhoc_submit_returns_the_same_job(world):
    allow_adhoc(world)
    first = post(world, {"spec": SPEC}, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(world, {"spec": SPEC}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and Job.objects.count() == 1
    other = post(
        world, {"spec": {**SPEC, "entrypoint": "python other.py"}}, HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert other.status_code == 409

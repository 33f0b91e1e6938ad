"""Template validation: every rule answers 400 naming the field, and stores nothing."""

import pytest

from jobs.models import JobTemplate, JobTemplateVersion
from tests.jobs.conftest import counter_spec

URL = "/api/v1/orgs/acme/workspaces/ml/templates/"


def worker(**changes):
    group = {"name": "w", "replicas": 1, "cpu": 1, "memory_gb": 1}
    group.update(changes)
    return group


RULES = [
    ({"entrypoint": "python a.py\npython b.py"}, "entrypoint", "&&"),
    ({"entrypoint": "   "}, "entrypoint", "blank"),
    ({"entrypoint": "x" * 5000}, "entrypoint", "4096"),
    ({"head": {"cpu": -1}}, "head.cpu", "greater than or equal"),
    ({"head": {"memory_gb": 100000}}, "head.memory_gb", "less than or equal"),
    ({"head": {"gpu": 1.5}}, "head.gpu", "integer"),
    ({"head": [{"cpu": 1}, {"cpu": 1}]}, "head", "exactly one head"),
    ({"worker_groups": [worker(), worker()]}, "worker_groups", "unique"),
    ({"worker_groups": [worker(name="Bad_Name")]}, "worker_groups.0.name", "DNS-safe"),
    (
        {"worker_groups": [worker(replicas=5, max_replicas=2)]},
        "worker_groups.0.replicas",
        "min_replicas..max_replicas",
    ),
    ({"worker_groups": [worker(resources={"GPU": 1})]}, "worker_groups.0.resources", "GPU"),
    ({"worker_groups": [worker(cpu="lots")]}, "worker_groups.0.cpu", "number"),
    ({"runtime_env": {"conda": "env.yaml"}}, "runtime_env.conda", "unknown field"),
    ({"runtime_env": {"pip": ["numpy>>1"]}}, "runtime_env.pip", "requirement specifier"),
    ({"runtime_env": {"env_vars": {"1BAD": "x"}}}, "runtime_env.env_vars", "1BAD"),
    ({"runtime_env": {"working_dir": "ftp://x y"}}, "runtime_env.working_dir", "URI"),
    # hostile runtime_env: the worker's files, pip options and paths, runtime variables
    ({"runtime_env": {"working_dir": "/tmp/code"}}, "runtime_env.working_dir", "host are refused"),
    ({"runtime_env": {"working_dir": "/"}}, "runtime_env.working_dir", "host are refused"),
    ({"runtime_env": {"working_dir": "code"}}, "runtime_env.working_dir", "remote URI"),
    ({"runtime_env": {"working_dir": "http://x.test/a.zip"}}, "runtime_env.working_dir", "https"),
    ({"runtime_env": {"working_dir": "file:///etc"}}, "runtime_env.working_dir", "remote URI"),
    ({"runtime_env": {"pip": ["-e", "."]}}, "runtime_env.pip", "options are not allowed"),
    (
        {"runtime_env": {"pip": ["--index-url=http://evil.test/simple"]}},
        "runtime_env.pip",
        "options are not allowed",
    ),
    ({"runtime_env": {"pip": ["/etc/passwd"]}}, "runtime_env.pip", "paths are not allowed"),
    ({"runtime_env": {"pip": ["./pkg"]}}, "runtime_env.pip", "paths are not allowed"),
    ({"runtime_env": {"pip": ["file:///srv/pkg"]}}, "runtime_env.pip", "paths are not allowed"),
    (
        {"runtime_env": {"pip": ["pkg @ file:///srv/pkg.whl"]}},
        "runtime_env.pip",
        "https:// or git+https://",
    ),
    ({"runtime_env": {"env_vars": {"PATH": "/tmp"}}}, "runtime_env.env_vars", "PATH"),
    ({"runtime_env": {"env_vars": {"A\x00B": "x"}}}, "runtime_env.env_vars", "invalid"),
    ({"runtime_env": {"pip": ["requests\x00"]}}, "runtime_env.pip.0", "null"),
    (
        {"runtime_env": {"working_dir": "https://x.test/\x00.zip"}},
        "runtime_env.working_dir",
        "null",
    ),
    ({"runtime_env": {"pip": ["x" * 201]}}, "runtime_env.pip.0", "200"),
    ({"runtime_env": {"env_vars": {"LD_PRELOAD": "x.so"}}}, "runtime_env.env_vars", "LD_*"),
    ({"runtime_env": {"env_vars": {"PYTHONPATH": "/x"}}}, "runtime_env.env_vars", "PYTHON*"),
    ({"runtime_env": {"env_vars": {"RAY_ADDRESS": "x"}}}, "runtime_env.env_vars", "RAY_*"),
    ({"runtime_env": {"env_vars": {"pip_index_url": "x"}}}, "runtime_env.env_vars", "PIP_*"),
    (
        {"runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}},
        "runtime_env.env_vars",
        "device visibility",
    ),
    # spec bounds: the organisation's max_nodes_per_job (16 by default)
    ({"worker_groups": [worker(replicas=1000)]}, "worker_groups", "max_nodes_per_job"),
    (
        {"worker_groups": [worker(replicas=1, max_replicas=16)]},
        "worker_groups",
        "allows 16 per job",
    ),
    ({"image": "docker.io/evil/miner:latest"}, "image", "image policy"),
    ({"image": "rayproject/ray:2.5.1-py310"}, "image", "Ray 2.5 is too old"),
    ({"max_runtime_seconds": 0}, "max_runtime_seconds", "greater than or equal"),
    ({"max_retries": 11}, "max_retries", "less than or equal"),
    ({"priority": 10}, "priority", "less than or equal"),
    ({"ttl_seconds_after_finished": -5}, "ttl_seconds_after_finished", "greater"),
    ({"allowed_overrides": ["image", "nonsense"]}, "allowed_overrides.1", "valid choice"),
    ({"name": "Not A Name"}, "name", "pattern"),
]


@pytest.mark.parametrize(("change", "field", "message"), RULES, ids=[r[1] for r in RULES])
def test_template_rule(world, change, field, message):
    body = {"name": "t1", **counter_spec(), **change}
    before = (JobTemplate.objects.count(), JobTemplateVersion.objects.count())
    response = world.client("ws_admin").post(URL, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert message.lower() in " ".join(errors[field]).lower(), errors[field]
    assert (JobTemplate.objects.count(), JobTemplateVersion.objects.count()) == before


def test_remote_code_and_plain_requirements_are_fine(world):
    runtime_env = {
        "working_dir": "https://github.com/acme/train/archive/refs/heads/main.zip",
        "pip": ["requests==2.32.3", "torch>=2.0; python_version>'3.8'",
                "pkg @ git+https://github.com/acme/pkg@v1"],
        "env_vars": {"COUNT_TO": "10", "OMP_NUM_THREADS": "1"},
    }  # fmt: skip
    body = {"name": "remote", **counter_spec(runtime_env=runtime_env)}
    response = world.client("ws_admin").post(URL, body, format="json")
    assert response.status_code == 201, response.content


def test_max_nodes_per_job_is_the_organisations(world):
    owner = world.client("owner")
    response = owner.patch("/api/v1/orgs/acme/", {"max_nodes_per_job": 0}, format="json")
    assert response.status_code == 400 and "max_nodes_per_job" in response.json()["errors"]
    response = owner.patch("/api/v1/orgs/acme/", {"max_nodes_per_job": 40}, format="json")
    assert response.status_code == 200 and response.json()["max_nodes_per_job"] == 40
    body = {"name": "wide", **counter_spec(worker_groups=[worker(replicas=39)])}
    assert world.client("ws_admin").post(URL, body, format="json").status_code == 201
    body = {"name": "wider", **counter_spec(worker_groups=[worker(replicas=40)])}
    response = world.client("ws_admin").post(URL, body, format="json")
    assert response.status_code == 400
    assert "allows 40 per job" in response.json()["errors"]["worker_groups"][0]


def test_missing_required_fields(world):
    response = world.client("ws_admin").post(URL, {"name": "t"}, format="json")
    assert response.status_code == 400
    assert {"image", "entrypoint"} <= set(response.json()["errors"])


def test_image_without_version_tag_and_new_ray_are_fine(world):
    client = world.client("ws_admin")
    for index, image in enumerate(
        ["rayproject/ray:latest", "rayproject/ray:2.60.0-py311-cpu", "rayproject/ray-ml"]
    ):
        body = {"name": f"img{index}", **counter_spec(image=image)}
        assert client.post(URL, body, format="json").status_code == 201, image


def test_org_image_policy_is_editable(world):
    world.client("owner").patch(
        "/api/v1/orgs/acme/", {"allowed_image_prefixes": ["ghcr.io/acme/"]}, format="json"
    )
    client = world.client("ws_admin")
    refused = client.post(URL, {"name": "a", **counter_spec()}, format="json")
    assert refused.status_code == 400 and "ghcr.io/acme/" in refused.json()["errors"]["image"][0]
    ok = client.post(
        URL, {"name": "a", **counter_spec(image="ghcr.io/acme/ray:2.60.0")}, format="json"
    )
    assert ok.status_code == 201


def test_edit_makes_a_new_version_and_jobs_keep_theirs(world, template):
    client = world.client("ws_admin")
    job = client.post(
        "/api/v1/orgs/acme/workspaces/ml/jobs/", {"template": template.pk}, format="json"
    ).json()
    assert job["template_version"] == 1
    edited = client.patch(f"{URL}{template.pk}/", {"entrypoint": "python -V"}, format="json")
    assert edited.status_code == 200, edited.content
    assert edited.json()["version"] == 2
    assert edited.json()["spec"]["entrypoint"] == "python -V"
    versions = client.get(f"{URL}{template.pk}/versions/").json()["results"]
    assert [v["version"] for v in versions] == [1, 2]
    assert versions[0]["spec"]["entrypoint"] != "python -V"
    again = client.get(f"/api/v1/orgs/acme/workspaces/ml/jobs/{job['id']}/").json()
    assert again["template_version"] == 1 and again["spec"]["entrypoint"] != "python -V"
    new_job = client.post(
        "/api/v1/orgs/acme/workspaces/ml/jobs/", {"template": template.pk}, format="json"
    ).json()
    assert new_job["template_version"] == 2
    bad = client.patch(f"{URL}{template.pk}/", {"entrypoint": "a\nb"}, format="json")
    assert bad.status_code == 400 and "entrypoint" in bad.json()["errors"]
    assert client.get(f"{URL}{template.pk}/").json()["version"] == 2


def test_archived_template_cannot_be_used(world, template):
    client = world.client("ws_admin")
    assert client.delete(f"{URL}{template.pk}/").status_code == 204
    assert client.get(URL).json()["count"] == 0
    response = client.post(
        "/api/v1/orgs/acme/workspaces/ml/jobs/", {"template": template.pk}, format="json"
    )
    assert response.status_code == 400 and "template" in response.json()["errors"]

"""manta submit --working-dir: the directory is zipped, checked by its sha256, uploaded only when
the workspace does not have it, and run as the job's working_dir; ad-hoc jobs without a
template."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest
from django.urls import Resolver404, resolve
from manta.commands.submit import upload_working_dir
from manta.workdir import package_working_dir

from jobs.models import Job
from packages.models import CodePackage

WS = "/api/v1/orgs/acme/workspaces/ml/"


def _packages_route_exists() -> bool:
    try:
        resolve(f"{WS}packages/{'0' * 64}/")
    except Resolver404:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _packages_route_exists(), reason="the server has no packages endpoint yet"
)


@pytest.fixture
def packages_endpoint(manta):
    """Skip unless the server answers a GET of an absent package with the API's own 404 (a
    server without the route answers Django's 404 page for the whole path)."""
    response = httpx.get(
        f"{manta.url}{WS}packages/{secrets.token_hex(32)}/",
        headers={"Authorization": f"Bearer {manta.world.tokens['developer']}"},
    )
    if response.status_code == 404 and "application/json" not in response.headers["content-type"]:
        pytest.skip("the server has no packages endpoint")
    assert response.status_code == 404 and response.json()["type"] == "not_found"


@pytest.fixture
def code(tmp_path):
    root = tmp_path / "code"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".gitignore").write_text("*.ckpt\n")
    (root / "main.py").write_text("print('hello from the package')\n")
    (root / "model.ckpt").write_text("weights stay home\n")
    return root


class RecordingTransport(httpx.HTTPTransport):
    """A real transport that remembers what was sent."""

    def __init__(self):
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return super().handle_request(request)


def test_submit_uploads_the_working_dir_once_and_runs_it(manta, counter, code, packages_endpoint):
    expected = package_working_dir(code)
    args = ["-o", "json", "submit", "--template", "counter", "--working-dir", str(code)]
    first = manta.as_user("developer", *args, "--", "python main.py")
    assert first.exit_code == 0, first.output
    assert "uploaded" in first.stderr and "already" not in first.stderr
    job = Job.objects.get(pk=json.loads(first.stdout)["id"])
    uri = f"manta://packages/{expected.sha256}"
    # The working_dir joins the template's own runtime_env instead of replacing it.
    assert job.spec["runtime_env"] == {"env_vars": {"COUNT_TO": "10"}, "working_dir": uri}
    assert job.spec["entrypoint"] == "python main.py"
    package = CodePackage.objects.get(workspace=manta.world.ws)
    assert (package.sha256, package.size) == (expected.sha256, expected.size)

    # The same directory again: the sha256 check finds it, nothing is uploaded.
    (code / "model.ckpt").write_text("changed, but ignored\n")
    second = manta.as_user("developer", *args, "--", "python main.py")
    assert second.exit_code == 0, second.output
    assert "already uploaded" in second.stderr
    assert json.loads(second.stdout)["spec"]["runtime_env"]["working_dir"] == uri
    assert CodePackage.objects.count() == 1


def test_the_sha_check_skips_the_upload_request(manta, counter, code, packages_endpoint):
    transport = RecordingTransport()
    token = manta.world.tokens["developer"]
    from manta import Client

    with Client(manta.url, token, org="acme", workspace="ml", transport=transport) as client:
        uri = upload_working_dir(client, code)
        assert [method for method, _ in transport.sent] == ["GET", "POST"]
        transport.sent.clear()
        assert upload_working_dir(client, code) == uri
        assert transport.sent == [("GET", f"{WS}packages/{uri.rsplit('/', 1)[1]}/")]


def test_a_package_is_per_workspace(manta, live_world, counter, code, packages_endpoint):
    from tests.conftest import SYSTEM
    from workspaces import services

    other = services.workspace_create(
        actor=SYSTEM, organization=live_world.org, slug="nlp", name="N"
    )
    services.member_add(actor=SYSTEM, workspace=other, email="dev@acme.test", role="developer")
    assert manta.as_user("developer", "submit", "--template", "counter", "--working-dir", str(code))
    env = manta.env("developer", MANTA_WORKSPACE="nlp")
    result = manta("--output", "json", "submit", "--image", "rayproject/ray:2.60.0",
                   "--working-dir", str(code), "--", "python main.py", env=env)  # fmt: skip
    # nlp does not take ad-hoc jobs, but its own copy of the package was uploaded first.
    assert result.exit_code == 2
    assert "uploaded" in result.stderr and "already" not in result.stderr
    assert "spec" in json.loads(result.stderr.splitlines()[-1])["errors"]  # the last line
    assert CodePackage.objects.filter(workspace=other).count() == 1


def test_an_adhoc_job_with_a_working_dir(manta, live_world, code, packages_endpoint):
    live_world.ws.adhoc_jobs = True
    live_world.ws.save()
    result = manta.as_user(
        "developer", "-o", "json", "submit", "--image", "rayproject/ray:2.60.0",
        "--working-dir", str(code), "--workers", "2", "--cpu", "1", "--memory-gb", "2",
        "--name", "mine", "--", "python", "main.py", "--steps", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    job = Job.objects.get(pk=json.loads(result.stdout)["id"])
    assert job.template_version is None and job.name == "mine"
    spec = job.spec
    assert spec["image"] == "rayproject/ray:2.60.0"
    assert spec["entrypoint"] == "python main.py --steps 3"
    assert spec["runtime_env"]["working_dir"].startswith("manta://packages/")
    assert spec["head"]["cpu"] == 0 and spec["head"]["memory_gb"] == 1
    group = spec["worker_groups"][0]
    assert (group["name"], group["replicas"], group["cpu"], group["gpu"], group["memory_gb"]) == (
        "workers", 2, 1, 0, 2,
    )  # fmt: skip
    listed = manta.as_user("developer", "jobs", "ls")
    assert "ad hoc" in listed.stdout


def test_an_adhoc_job_needs_an_image_and_a_workspace_that_allows_it(manta, live_world):
    no_image = manta.as_user("developer", "submit", "--", "python x.py")
    assert no_image.exit_code == 2 and "--image" in no_image.stderr
    refused = manta.as_user("developer", "submit", "--image", "rayproject/ray:2.60.0", "--", "x")
    assert refused.exit_code == 2
    assert "spec: " in refused.stderr and "adhoc_jobs" in refused.stderr


def test_sources_ls_and_an_adhoc_job_from_a_code_source(manta, live_world, monkeypatch):
    from config import ssrf
    from packages import sources
    from tests.conftest import SYSTEM

    public = [ssrf.ipaddress.ip_address("93.184.216.34")]
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: public)
    sources.source_create(
        actor=SYSTEM,
        workspace=live_world.ws,
        name="trainer",
        url="https://git.example.com/acme/trainer.git",
    )
    listed = manta.as_user("developer", "sources", "ls")
    assert listed.exit_code == 0 and "git.example.com/acme/trainer.git" in listed.stdout
    live_world.ws.adhoc_jobs = True
    live_world.ws.save()
    result = manta.as_user(
        "developer", "-o", "json", "submit", "--image", "rayproject/ray:2.60.0",
        "--source", "trainer", "--ref", "v1.2", "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    job = Job.objects.get(pk=json.loads(result.stdout)["id"])
    assert job.spec["code"] == {"source": "trainer", "ref": "v1.2"}
    assert "working_dir" not in job.spec["runtime_env"]
    both = manta.as_user(
        "developer", "submit", "--image", "i", "--source", "trainer", "--working-dir", ".",
        "--", "x",
    )  # fmt: skip
    assert both.exit_code == 2 and "not both" in both.stderr

"""Code packages: upload a zip of a working directory, stored once per content, checked entry by
entry, used by jobs of its own workspace only, and expired once no job uses it."""

from __future__ import annotations

import datetime as dt
import io
import stat
import time
import zipfile
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.utils import timezone
from rest_framework.test import APIClient

from audit.context import Actor
from jobs import launch_requests
from jobs import services as job_services
from jobs.models import Job, JobAttempt
from jobs.selectors import package_in_use
from packages import services
from packages.models import CodePackage
from tests.factories import WorkspaceFactory, WorkspaceMembershipFactory

WS = "/api/v1/orgs/acme/workspaces/ml/"


def zip_of(files: dict[str, str], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


CODE = zip_of(
    {"train.py": "import helper\nprint(helper.GREETING)\n", "helper.py": "GREETING = 'hi'\n"}
)


@pytest.fixture(autouse=True)
def package_store(package_storage):
    return package_storage


def blobs(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.zip")) if root.exists() else []


def upload(world, body: bytes, who="developer", ws=WS, content_type="application/zip"):
    return world.client(who).post(ws + "packages/", data=body, content_type=content_type)


def test_the_same_content_is_stored_once(world, package_store):
    first = upload(world, CODE)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["uri"] == f"manta://packages/{body['sha256']}" and body["size"] == len(CODE)
    assert body["uploaded_by"] == "dev@acme.test"
    again = upload(world, CODE)
    assert again.status_code == 200 and again.json()["sha256"] == body["sha256"]
    assert len(blobs(package_store)) == 1
    assert CodePackage.objects.count() == 1
    got = world.client("viewer").get(f"{WS}packages/{body['sha256']}/")
    assert got.status_code == 200 and got.json()["sha256"] == body["sha256"]
    assert world.client("viewer").get(f"{WS}packages/{'0' * 64}/").status_code == 404
    for hostile in ("..%2F..%2Fetc%2Fpasswd", "%00", "A" * 64, "x" * 5000):
        assert world.client("viewer").get(f"{WS}packages/{hostile}/").status_code == 404


def test_another_workspace_does_not_see_a_package_it_did_not_upload(world, package_store):
    sha = upload(world, CODE).json()["sha256"]
    WorkspaceMembershipFactory(
        workspace=WorkspaceFactory(organization=world.org, slug="other"),
        user=world.users["developer"],
        role="developer",
    )
    other = "/api/v1/orgs/acme/workspaces/other/"
    assert world.client("developer").get(f"{other}packages/{sha}/").status_code == 404
    # Uploading it there too: a row of that workspace, the bytes still stored once.
    assert upload(world, CODE, ws=other).status_code == 201
    assert len(blobs(package_store)) == 1


@pytest.mark.parametrize(
    ("body", "entry", "rule"),
    [
        (zip_of({"../evil.py": "x"}), "../evil.py", "'..' is not allowed"),
        (zip_of({"a/../../evil.py": "x"}), "a/../../evil.py", "'..' is not allowed"),
        (zip_of({"/etc/cron.d/evil": "x"}), "/etc/cron.d/evil", "absolute paths"),
        (zip_of({"C:/evil": "x"}), "C:/evil", "absolute paths"),
        (zip_of({"ok.py": "x"}, links={"out": "/etc/passwd"}), "out", "links are not allowed"),
    ],
)
def test_entries_that_leave_the_directory_are_refused_naming_them(
    world, package_store, body, entry, rule
):
    response = upload(world, body)
    assert response.status_code == 400, response.content
    message = response.json()["errors"]["package"][0]
    assert repr(entry) in message and rule in message
    assert not CodePackage.objects.exists() and blobs(package_store) == []


def test_not_a_zip_an_empty_body_and_another_media_type_are_refused(world, package_store):
    assert "not a zip archive" in str(upload(world, b"hello").json())
    assert "empty" in str(upload(world, b"").json())
    refused = upload(world, CODE, content_type="application/json")
    assert refused.status_code == 415 and "application/zip" in refused.json()["detail"]
    assert not CodePackage.objects.exists() and blobs(package_store) == []


def test_an_oversize_upload_is_413_with_the_limit(world, package_store, settings):
    settings.MANTA_PACKAGE_MAX_BYTES = 100
    response = upload(world, CODE)
    assert response.status_code == 413
    assert "the limit is 100 bytes" in response.json()["detail"]
    assert not CodePackage.objects.exists() and blobs(package_store) == []


def test_a_zip_that_unpacks_past_the_limit_is_refused(world, settings):
    settings.MANTA_PACKAGE_MAX_UNPACKED_BYTES = 1000
    body = zip_of({"big.txt": "0" * 5000})  # compresses to a few bytes
    response = upload(world, body)
    assert response.status_code == 400 and "unpacks to 5000 bytes" in str(response.json())


def test_viewers_cannot_upload(world):
    assert upload(world, CODE, who="viewer").status_code == 403


def test_jobs_run_packages_of_their_own_workspace_only(world, template):
    from jobs.models import JobTemplateVersion

    version = JobTemplateVersion.objects.get(template=template, version=template.latest_version)
    version.allowed_overrides = [*version.allowed_overrides, "runtime_env"]
    version.save()
    dev = Actor.for_user(world.users["developer"])
    sha = upload(world, CODE).json()["sha256"]
    job = job_services.job_submit(
        actor=dev,
        workspace=world.ws,
        template=template,
        overrides={"runtime_env": {"working_dir": f"manta://packages/{sha}"}},
    )
    assert job.spec["runtime_env"]["working_dir"] == f"manta://packages/{sha}"
    unknown = {"runtime_env": {"working_dir": f"manta://packages/{'a' * 64}"}}
    response = world.client("developer").post(
        WS + "jobs/", {"template": template.pk, "overrides": unknown}, format="json"
    )
    assert response.status_code == 400
    assert "upload it first" in response.json()["errors"]["runtime_env.working_dir"][0]
    bad = {"runtime_env": {"working_dir": "manta://packages/../../etc"}}
    response = world.client("developer").post(
        WS + "jobs/", {"template": template.pk, "overrides": bad}, format="json"
    )
    assert response.status_code == 400 and "manta://packages/<sha256>" in str(response.json())
    assert Job.objects.count() == 1


def test_packages_no_job_used_for_the_retention_period_expire(world, package_store, settings):
    sha = upload(world, CODE).json()["sha256"]
    now = timezone.now()
    assert services.packages_expire(now=now, in_use=package_in_use) == 0
    later = now + dt.timedelta(days=settings.MANTA_PACKAGE_RETENTION_DAYS + 1)
    assert services.packages_expire(now=later, in_use=package_in_use) == 1
    assert not CodePackage.objects.filter(sha256=sha).exists() and blobs(package_store) == []
    assert not storages["packages"].exists(services.blob_name(sha))


# --- kuberay: the cluster downloads the package from a short-lived signed link ------------------


def kuberay_workspace(world):
    from tests.jobs.test_compute_targets import KUBECONFIG

    created = world.client("owner").post(
        "/api/v1/orgs/acme/compute-targets/",
        {"name": "k8s", "kind": "kuberay", "config": {"kubeconfig": KUBECONFIG}},
        format="json",
    )
    assert created.status_code == 201, created.content
    changed = world.client("owner").patch(WS, {"compute_target": "k8s"}, format="json")
    assert changed.status_code == 200
    world.ws.refresh_from_db()


def submit_package_job(world, uri):
    world.ws.adhoc_jobs = True
    world.ws.save()
    spec = {
        "image": "rayproject/ray:2.60.0",
        "entrypoint": "python train.py",
        "runtime_env": {"working_dir": uri},
    }
    return world.client("developer").post(WS + "jobs/", {"spec": spec}, format="json")


def test_a_kuberay_job_gets_a_signed_link_that_serves_the_package(world, settings):
    settings.MANTA_PUBLIC_URL = "https://manta.acme.test"
    kuberay_workspace(world)
    uri = upload(world, CODE).json()["uri"]
    submitted = submit_package_job(world, uri)
    assert submitted.status_code == 201, submitted.content
    job = Job.objects.get(pk=submitted.json()["id"])
    # The plan shows the package, never a working link.
    plan = world.client("viewer").get(f"{WS}jobs/{job.pk}/launch-plan/").json()
    assert uri in plan["manifest"]["spec"]["runtimeEnvYAML"]
    attempt = JobAttempt.objects.create(job=job, number=1, cluster_name="k-1")
    request = launch_requests.launch_request(attempt, launch_requests.resolve_target(job))
    link = request.spec["runtime_env"]["working_dir"]
    assert link.startswith("https://manta.acme.test/api/v1/package-downloads/")
    assert link.endswith(".zip") and not request.packages
    path = link.removeprefix("https://manta.acme.test")
    anonymous = APIClient()
    got = anonymous.get(path)
    assert got.status_code == 200 and b"".join(got.streaming_content) == CODE
    tampered = path.replace(path[-8:-4], "0000" if path[-8:-4] != "0000" else "1111")
    assert anonymous.get(tampered).status_code == 404
    sha = uri.rsplit("/", 1)[1]
    expired = services.download_url(sha, now=0).removeprefix("https://manta.acme.test")
    assert anonymous.get(expired).status_code == 404
    assert anonymous.get("/api/v1/package-downloads/" + "0" * 64 + "-1-x.zip").status_code == 404


def test_kuberay_refuses_packages_where_no_link_can_be_made(world, settings):
    settings.MANTA_PUBLIC_URL = ""
    kuberay_workspace(world)
    uri = upload(world, CODE).json()["uri"]
    response = submit_package_job(world, uri)
    assert response.status_code == 400
    assert "MANTA_PUBLIC_URL" in response.json()["errors"]["runtime_env.working_dir"][0]
    assert not Job.objects.exists()


def test_object_storage_presigns_the_link_itself(settings):
    """S3-compatible storage signs its own URL (computed locally by boto3; no S3 is contacted)."""
    settings.MANTA_PUBLIC_URL = ""
    settings.MANTA_PACKAGE_URL_SECONDS = 600
    settings.STORAGES = {
        **settings.STORAGES,
        "packages": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": "manta-packages",
                "endpoint_url": "https://s3.acme.test",
                "access_key": "AKIAEXAMPLE",
                "secret_key": "secret",
                "region_name": "us-east-1",
            },
        },
    }
    assert services.download_urls_available()
    sha = "ab" * 32
    link = services.download_url(sha)
    path, _, query = link.partition("?")
    assert path.startswith("https://s3.acme.test/manta-packages/ab/") and path.endswith(".zip")
    fields = dict(part.split("=", 1) for part in query.split("&"))
    assert fields.get("Signature") or fields.get("X-Amz-Signature")
    if "Expires" in fields:  # signature v2: an absolute time
        assert abs(int(fields["Expires"]) - (time.time() + 600)) < 30
    else:
        assert fields["X-Amz-Expires"] == "600"

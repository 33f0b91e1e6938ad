"""Git code sources: registered per workspace behind the same network policy as webhooks, a
deploy key kept encrypted and never shown, and one commit fetched from a real ``git daemon`` on
127.0.0.1, packaged like an upload and recorded on the attempt (retries reuse it)."""

from __future__ import annotations

import io
import zipfile

import pytest
from django.core.files.storage import storages
from django.db import connection

from audit.models import AuditEvent
from jobs import launch_requests, launching
from jobs.models import Job, JobAttempt
from packages import sources
from packages.models import CodePackage, CodeSource
from tests.conftest import SYSTEM
from tests.gitserver import Repository
from tests.notifications.test_ssrf import INTERNAL_ADDRESSES, resolver  # noqa: F401
from tests.test_schema import load_schema

WS = "/api/v1/orgs/acme/workspaces/ml/"
SOURCES = WS + "code-sources/"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-secret-material\n-----END OPENSSH PRIVATE KEY-----\n"  # noqa: E501


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repository = Repository(tmp_path_factory.mktemp("git"))
    yield repository
    repository.stop()


@pytest.fixture(autouse=True)
def policy(settings, package_storage):
    """Loopback allowed, as a test serving its own repository needs; git:// allowed."""
    settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.MANTA_CODE_SOURCE_ALLOW_PLAIN = True


def create(world, body, who="ws_admin"):
    return world.client(who).post(SOURCES, body, format="json")


def refused(world, body, field="url"):
    before = CodeSource.objects.count()
    response = create(world, {"name": "src", **body})
    assert response.status_code == 400, response.content
    assert CodeSource.objects.count() == before
    return response.json()["errors"][field][0]


# --- registering ------------------------------------------------------------------------------


def test_a_source_is_registered_listed_changed_and_removed_with_audit(world, repo):
    response = create(world, {"name": "trainer", "url": repo.url, "deploy_key": KEY})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["has_deploy_key"] is True and "deploy_key" not in body
    assert body["default_ref"] == "main"
    listed = world.client("viewer").get(SOURCES).json()["results"]
    assert [s["name"] for s in listed] == ["trainer"]
    changed = world.client("ws_admin").patch(
        SOURCES + "trainer/", {"default_ref": "v1.0", "deploy_key": ""}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["has_deploy_key"] is False
    assert world.client("ws_admin").delete(SOURCES + "trainer/").status_code == 204
    actions = list(
        AuditEvent.objects.filter(action__startswith="code_source.").values_list(
            "action", flat=True
        )
    )
    assert actions == ["code_source.create", "code_source.update", "code_source.delete"]


def test_the_deploy_key_is_stored_encrypted_and_never_shown(world, repo):
    assert create(world, {"name": "trainer", "url": repo.url, "deploy_key": KEY}).status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("SELECT deploy_key_encrypted FROM packages_codesource")
        (stored,) = cursor.fetchone()
    assert stored and "secret-material" not in stored and "PRIVATE KEY" not in stored
    shown = world.client("ws_admin").get(SOURCES + "trainer/").content.decode()
    audit = str(list(AuditEvent.objects.values_list("changes", "metadata")))
    assert "secret-material" not in shown and "secret-material" not in audit


def test_developers_read_sources_and_only_admins_change_them(world, repo):
    assert create(world, {"name": "x", "url": repo.url}, who="developer").status_code == 403
    assert create(world, {"name": "x", "url": repo.url}, who="foreign").status_code == 404
    assert world.client("developer").get(SOURCES).status_code == 200


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("file:///srv/repo.git", "must start with"),
        ("/srv/repo.git", "host paths"),
        ("../repo", "host paths"),
        ("git@github.com:acme/repo.git", "scp-like"),
        ("ext::sh -c touch% /tmp/pwned", "without spaces"),
        ("ext::sh", "host paths"),
        ("fd::3", "host paths"),
        ("https://user:secret@github.com/acme/repo.git", "credentials"),
        ("ftp://github.com/acme/repo.git", "must start with"),
    ],
)
def test_urls_that_are_not_remote_repositories_are_refused(world, url, rule):
    assert rule in refused(world, {"url": url})


@pytest.mark.parametrize(("address", "rule"), INTERNAL_ADDRESSES)
def test_the_network_policy_of_webhooks_applies(world, settings, address, rule):
    settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS = []
    host = f"[{address}]" if ":" in address else address
    message = refused(world, {"url": f"https://{host}/acme/repo.git"})
    assert rule in message and "MANTA_CODE_SOURCE_ALLOWED_NETWORKS" in message


def test_names_are_resolved_and_plain_protocols_need_the_setting(world, settings, resolver):  # noqa: F811
    settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS = []
    resolver["git.acme.test"] = ["93.184.216.34", "10.0.0.1"]
    assert "resolves to 10.0.0.1" in refused(world, {"url": "https://git.acme.test/r.git"})
    for url in ("http://0x7f000001/r.git", "https://2130706433/r.git", "https://127.1/r.git"):
        settings.MANTA_CODE_SOURCE_ALLOW_PLAIN = True
        assert "loopback" in refused(world, {"url": url})
    settings.MANTA_CODE_SOURCE_ALLOW_PLAIN = False
    resolver["git.example.test"] = ["93.184.216.34"]
    assert "MANTA_CODE_SOURCE_ALLOW_PLAIN" in refused(
        world, {"url": "git://git.example.test/r.git"}
    )
    assert (
        create(world, {"name": "ok", "url": "ssh://git@git.example.test/r.git"}).status_code == 201
    )


@pytest.mark.parametrize("ref", ["-upload-pack=touch", "a..b", "main/", "x@{1}", "a b", "/main"])
def test_refs_that_git_could_take_as_options_or_ranges_are_refused(world, repo, ref):
    assert "branch, a tag or a commit" in refused(
        world, {"url": repo.url, "default_ref": ref}, field="default_ref"
    )


def test_unknown_fields_and_bad_keys_are_refused(world, repo):
    assert "unknown field" in refused(world, {"url": repo.url, "deploy_keys": KEY}, "deploy_keys")
    assert "SSH private key" in refused(
        world, {"url": repo.url, "deploy_key": "hunter2"}, field="deploy_key"
    )


# --- fetching ----------------------------------------------------------------------------------


def source_of(world, repo, **extra) -> CodeSource:
    return sources.source_create(
        actor=SYSTEM, workspace=world.ws, name="trainer", url=repo.url, **extra
    )


def files_of(package: CodePackage) -> dict[str, str]:
    with storages["packages"].open(f"{package.sha256[:2]}/{package.sha256}.zip") as blob:
        archive = zipfile.ZipFile(io.BytesIO(blob.read()))
        return {name: archive.read(name).decode() for name in archive.namelist()}


def test_a_ref_is_fetched_packaged_and_its_commit_named(world, repo):
    head = repo.push()
    fetched = sources.fetch(source_of(world, repo), "main", actor=SYSTEM)
    assert fetched.commit == head
    files = files_of(fetched.package)
    assert files["lib/helper.py"] == "GREETING = 'hello from git'\n"
    assert set(files) >= {"train.py", "lib/__init__.py"}
    again = sources.fetch(CodeSource.objects.get(name="trainer"), head, actor=SYSTEM)
    assert again.package.pk == fetched.package.pk  # the same commit is stored once


def test_an_unknown_ref_or_a_refused_address_fails_with_the_reason(world, repo, settings):
    source = source_of(world, repo)
    with pytest.raises(sources.CodeUnavailable, match="no-such-branch"):
        sources.fetch(source, "no-such-branch", actor=SYSTEM)
    # The policy changed after the source was saved: checked again before every fetch.
    settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS = []
    with pytest.raises(sources.CodeUnavailable, match="loopback"):
        sources.fetch(source, "main", actor=SYSTEM)


def test_a_name_that_now_resolves_inward_is_refused_at_fetch(world, repo, settings, resolver):  # noqa: F811
    settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS = []
    resolver["git.acme.test"] = ["93.184.216.34"]
    source = sources.source_create(
        actor=SYSTEM, workspace=world.ws, name="s", url=f"git://git.acme.test:{repo.port}/repo.git"
    )
    resolver["git.acme.test"] = ["127.0.0.1"]
    with pytest.raises(sources.CodeUnavailable, match=r"resolves to 127\.0\.0\.1"):
        sources.fetch(source, "main", actor=SYSTEM)


def test_a_job_names_its_source_and_the_ref_is_fixed_at_submit(world, repo):
    source_of(world, repo)
    world.ws.adhoc_jobs = True
    world.ws.save()
    spec = {"image": "rayproject/ray:2.60.0", "entrypoint": "python train.py"}
    client = world.client("developer")
    unknown = client.post(
        WS + "jobs/", {"spec": {**spec, "code": {"source": "nope"}}}, format="json"
    )
    assert unknown.status_code == 400 and "code.source" in unknown.json()["errors"]
    remote = {"working_dir": "https://x.test/a.zip"}
    both = {**spec, "code": {"source": "trainer"}, "runtime_env": remote}
    refused_both = client.post(WS + "jobs/", {"spec": both}, format="json")
    assert refused_both.status_code == 400 and "not both" in str(refused_both.json())
    bad_ref = client.post(
        WS + "jobs/",
        {"spec": {**spec, "code": {"source": "trainer", "ref": "--all"}}},
        format="json",
    )
    assert bad_ref.status_code == 400 and "spec.code.ref" in bad_ref.json()["errors"]
    ok = client.post(WS + "jobs/", {"spec": {**spec, "code": {"source": "trainer"}}}, format="json")
    assert ok.status_code == 201, ok.content
    assert Job.objects.get(pk=ok.json()["id"]).spec["code"] == {"source": "trainer", "ref": "main"}


def test_an_attempt_records_its_commit_and_a_retry_reuses_it(world, repo):
    first_head = repo.push()
    source_of(world, repo)
    world.ws.adhoc_jobs = True
    world.ws.save()
    spec = {"image": "rayproject/ray:2.60.0", "entrypoint": "python train.py"}
    submitted = world.client("developer").post(
        WS + "jobs/", {"spec": {**spec, "code": {"source": "trainer"}}}, format="json"
    )
    job = Job.objects.get(pk=submitted.json()["id"])
    one = JobAttempt.objects.create(job=job, number=1, cluster_name="c-1")
    launching._fetch_code(one)
    one.refresh_from_db()
    assert one.code_commit == first_head and len(one.code_package) == 64
    request = launch_requests.launch_request(one, launch_requests.resolve_target(job))
    assert request.spec["runtime_env"]["working_dir"] == f"manta://packages/{one.code_package}"
    assert request.packages  # the zip travels to the cluster like an upload
    repo.commit({"train.py": "print('a newer commit')\n"})
    assert repo.push() != first_head
    two = JobAttempt.objects.create(job=job, number=2, cluster_name="c-2")
    launching._fetch_code(two)
    two.refresh_from_db()
    assert (two.code_commit, two.code_package) == (one.code_commit, one.code_package)


def test_a_fetched_package_and_a_source_nobody_made_name_no_user_as_the_schema_says(world, repo):
    """A worker fetches as the system: the package it stores has no uploader."""
    repo.push()
    fetched = sources.fetch(source_of(world, repo), "main", actor=SYSTEM)
    source = world.client("viewer").get(SOURCES + "trainer/")
    package = world.client("viewer").get(f"{WS}packages/{fetched.package.sha256}/")
    assert source.json()["created_by"] is None and package.json()["uploaded_by"] is None
    schemas = load_schema()["components"]["schemas"]
    assert schemas["CodeSourceOutput"]["properties"]["created_by"]["nullable"] is True
    assert schemas["PackageOutput"]["properties"]["uploaded_by"]["nullable"] is True


def test_oversized_refs_and_known_hosts_are_refused(world, repo):
    assert "255 characters" in refused(
        world, {"url": repo.url, "default_ref": "a" * 256}, field="default_ref"
    )
    too_long = "github.com ssh-ed25519 " + "A" * 17000
    assert "at most" in refused(world, {"url": repo.url, "known_hosts": too_long}, "known_hosts")

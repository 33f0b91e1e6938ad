"""manta jobs / templates / quota against the real API: JSON for scripts, tables for people,
the API's errors on stderr with the exit codes scripts rely on."""

from __future__ import annotations

import json

from jobs.models import Job
from tests.jobs.conftest import submit as submit_job
from workspaces.models import IdempotencyRecord


def test_jobs_ls_and_get_as_json(manta, live_world, counter):
    first = submit_job(live_world, counter, name="first")
    second = submit_job(live_world, counter, name="second", who="developer2")

    result = manta.as_user("developer", "--output", "json", "jobs", "ls")
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)
    assert [j["id"] for j in jobs] == [second.pk, first.pk]
    assert jobs[0]["state"] == "queued" and jobs[0]["submitted_by"] == "dev2@acme.test"

    mine = manta.as_user("developer", "jobs", "ls", "--mine", "-o", "json")
    assert [j["id"] for j in json.loads(mine.stdout)] == [first.pk]
    limited = manta.as_user("developer", "jobs", "ls", "--limit", "1", "-o", "json")
    assert [j["id"] for j in json.loads(limited.stdout)] == [second.pk]
    none = manta.as_user("developer", "jobs", "ls", "--state", "running", "-o", "json")
    assert json.loads(none.stdout) == []

    got = manta.as_user("developer", "jobs", "get", str(first.pk), "--output", "json")
    assert got.exit_code == 0, got.output
    job = json.loads(got.stdout)
    assert (job["id"], job["name"], job["state"]) == (first.pk, "first", "queued")
    assert job["queue"]["position"] >= 1 and job["queue"]["waiting_for"]


def test_jobs_ls_and_get_as_tables(manta, live_world, counter):
    job = submit_job(live_world, counter, name="tabled")
    listed = manta.as_user("developer", "jobs", "ls")
    assert listed.exit_code == 0, listed.output
    assert "tabled" in listed.stdout and "queued" in listed.stdout and "counter" in listed.stdout
    shown = manta.as_user("developer", "jobs", "get", str(job.pk))
    assert shown.exit_code == 0, shown.output
    assert f"job {job.pk}" in shown.stdout and "queued" in shown.stdout


def test_a_400_prints_the_field_errors_and_exits_2(manta, counter):
    result = manta.as_user("developer", "submit", "--template", "counter", "--name", "Not OK!")
    assert result.exit_code == 2, result.output
    assert "Error:" in result.stderr and "validation_error" in result.stderr
    assert "  name: " in result.stderr
    assert result.stdout == ""
    assert not Job.objects.exists()

    as_json = manta.as_user(
        "developer", "-o", "json", "submit", "--template", "counter", "--workers", "1000"
    )
    assert as_json.exit_code == 2
    body = json.loads(as_json.stderr)
    assert body["status"] == 400 and body["type"] == "validation_error"
    assert any(field.startswith("overrides.worker_groups") for field in body["errors"])


def test_other_refusals_exit_1_and_usage_errors_exit_2(manta, live_world, counter):
    missing = manta.as_user("developer", "jobs", "get", "999999")
    assert missing.exit_code == 1 and "not_found" in missing.stderr
    unknown = manta.as_user("developer", "submit", "--template", "nope")
    assert unknown.exit_code == 2 and "no template named 'nope'" in unknown.stderr
    no_entrypoint = manta.as_user("developer", "submit")
    assert no_entrypoint.exit_code == 2
    bad_flag = manta.as_user("developer", "jobs", "ls", "--limit", "zero")
    assert bad_flag.exit_code == 2


def test_approve_reject_and_cancel(manta, live_world, counter):
    live_world.ws.approval_policy = "always"
    live_world.ws.save()
    approved, rejected, cancelled = (submit_job(live_world, counter) for _ in range(3))

    developer = manta.as_user("developer", "jobs", "approve", str(approved.pk))
    assert developer.exit_code == 1 and "permission_denied" in developer.stderr
    result = manta.as_user("ws_admin", "-o", "json", "jobs", "approve", str(approved.pk))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "queued"

    no_reason = manta.as_user("ws_admin", "jobs", "reject", str(rejected.pk))
    assert no_reason.exit_code == 2  # --reason is required
    result = manta.as_user("ws_admin", "jobs", "reject", str(rejected.pk), "--reason", "too big")
    assert result.exit_code == 0, result.output
    assert "rejected" in result.stdout

    result = manta.as_user("developer", "jobs", "cancel", str(cancelled.pk), "--reason", "oops")
    assert result.exit_code == 0, result.output
    assert Job.objects.get(pk=cancelled.pk).state == "cancelled"
    events = manta.as_user("developer", "-o", "json", "jobs", "events", str(cancelled.pk))
    assert [e["kind"] for e in json.loads(events.stdout)][-1] == "cancelled"
    again = manta.as_user("developer", "jobs", "cancel", str(cancelled.pk))
    assert again.exit_code == 1 and "invalid_transition" in again.stderr


def test_templates_and_quota(manta, counter):
    listed = manta.as_user("developer", "templates", "ls")
    assert listed.exit_code == 0 and "counter" in listed.stdout
    got = manta.as_user("developer", "templates", "get", "counter", "-o", "json")
    assert got.exit_code == 0, got.output
    body = json.loads(got.stdout)
    assert body["id"] == counter.pk and "runtime_env" in body["allowed_overrides"]
    by_id = manta.as_user("developer", "templates", "get", str(counter.pk))
    assert by_id.exit_code == 0 and "rayproject/ray" in by_id.stdout

    quota = manta.as_user("developer", "quota", "-o", "json")
    assert quota.exit_code == 0, quota.output
    body = json.loads(quota.stdout)
    assert set(body) == {"quota", "usage"} and "reserved" in body["usage"]
    table = manta.as_user("developer", "quota")
    assert table.exit_code == 0 and "cpu" in table.stdout


def test_logs_of_a_job_without_attempts(manta, live_world, counter):
    job = submit_job(live_world, counter)
    result = manta.as_user("developer", "-o", "json", "jobs", "logs", str(job.pk))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"attempt": None, "source": "none", "logs": "", "offset": 0}


def test_submit_from_a_template_sends_overrides_and_an_idempotency_key(manta, counter):
    result = manta.as_user(
        "developer",
        "-o",
        "json",
        "submit",
        "--template",
        "counter",
        "--name",
        "tuned",
        "--workers",
        "2",
        "--",
        "python",
        "-c",
        "print('hi there')",
    )
    assert result.exit_code == 0, result.output
    job = Job.objects.get(pk=json.loads(result.stdout)["id"])
    assert job.name == "tuned" and job.state == "queued"
    assert job.spec["entrypoint"] == "python -c 'print('\"'\"'hi there'\"'\"')'"
    # Only the replicas changed; the rest of the template's worker group stays.
    assert job.spec["worker_groups"][0]["replicas"] == 2
    assert job.spec["worker_groups"][0]["max_replicas"] == 2
    assert set(job.overrides) == {"entrypoint", "worker_groups"}
    (sent,) = IdempotencyRecord.objects.filter(path__endswith="/jobs/")
    assert sent.key.startswith("manta-cli-")


def test_one_word_entrypoint_is_a_shell_line(manta, counter):
    line = "pip list && python -c 'print(1)'"
    result = manta.as_user("developer", "-o", "json", "submit", "--template", "counter", "--", line)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["spec"]["entrypoint"] == line


def test_the_sdk_raises_api_errors_and_replays_a_submission(manta, counter):
    from manta import ApiError

    with manta.client("developer") as client:
        try:
            client.submit_job(template=counter.pk, name="BAD NAME")
        except ApiError as exc:
            assert exc.status == 400 and exc.type == "validation_error"
            assert "name" in exc.errors and exc.detail and exc.request_id
        else:
            raise AssertionError("no ApiError")
        first = client.submit_job(template=counter.pk, idempotency_key="retry-1")
        again = client.submit_job(template=counter.pk, idempotency_key="retry-1")
        assert first["id"] == again["id"]
        assert Job.objects.count() == 1
        assert client.find_template("counter")["id"] == counter.pk
        assert client.find_template("absent") is None


def test_an_admin_cancels_any_job(manta, live_world, counter):
    job = submit_job(live_world, counter)
    result = manta.as_user("ws_admin", "jobs", "cancel", str(job.pk))
    assert result.exit_code == 0, result.output
    job.refresh_from_db()
    assert job.state == "cancelled"


def test_the_sdk_lists_every_job_once_following_cursors(manta, live_world, counter, monkeypatch):
    """Past the first page the SDK follows the list's cursor, not page numbers: a job
    submitted meanwhile does not push one already shown onto the next page again."""
    from manta import client as sdk

    monkeypatch.setattr(sdk, "MAX_PAGE_SIZE", 2)
    made = [submit_job(live_world, counter, name=f"j{n}").pk for n in range(5)]
    client = manta.client("developer")
    seen, requests = [], []
    client._http.event_hooks["request"].append(lambda request: requests.append(request.url))
    for job in client._pages(client._ws_path("jobs/")):
        seen.append(job["id"])
        if len(seen) == 1:
            submit_job(live_world, counter, name="meanwhile")
    assert seen == sorted(made, reverse=True)
    assert "page" in requests[0].params and all("cursor" in url.params for url in requests[1:])

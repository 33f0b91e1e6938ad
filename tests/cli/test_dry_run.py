"""manta submit --dry-run: what the submission would do, and nothing submitted."""

from __future__ import annotations

import json

from audit.context import Actor
from jobs import admission
from jobs import services as job_services
from jobs.models import Job
from quotas.models import OrgQuota
from tests.factories import JobTemplateFactory


def test_submit_dry_run(manta, counter):
    as_json = manta.as_user(
        "developer", "-o", "json", "submit", "--template", "counter", "--dry-run"
    )
    assert as_json.exit_code == 0, as_json.output
    answer = json.loads(as_json.stdout)
    assert answer["dry_run"] is True and answer["would_admit_now"] is True
    assert answer["position"] == 0 and answer["predicted_start"]["p50"]

    shown = manta.as_user("developer", "submit", "--template", "counter", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "would be admitted now" in shown.stdout and "expected:  to start around" in shown.stdout

    bad = manta.as_user(
        "developer", "submit", "--template", "counter", "--dry-run", "--workers", "1000"
    )
    assert bad.exit_code == 2 and "validation_error" in bad.stderr
    assert not Job.objects.exists()


def gpu_template(world, name, gpu):
    node = {"name": "g", "replicas": 1, "cpu": 0, "memory_gb": 0, "gpu": gpu}
    return JobTemplateFactory(
        workspace=world.ws, name=name, version__spec_changes={"worker_groups": [node]}
    )


def test_a_dry_run_that_would_wait_says_what_for_in_words(manta, live_world):
    # fifo, 3 GPUs: a 2-GPU job runs and the next 2-GPU job waits for the GPU it lacks. A
    # 1-GPU job would fit, but waits behind it: the terminal says so, not a category.
    OrgQuota.objects.create(organization=live_world.org, gpu=3, policy="fifo")
    big = gpu_template(live_world, "big", 2)
    gpu_template(live_world, "small", 1)  # what the dry run asks for
    actor = Actor.for_user(live_world.users["developer"])
    for _ in range(2):
        job_services.job_submit(actor=actor, workspace=live_world.ws, template=big)
    admission.admit(live_world.org.pk)
    running, head = Job.objects.order_by("pk")
    assert (Job.objects.get(pk=running.pk).state, head.state) == ("launching", "queued")

    shown = manta.as_user("developer", "submit", "--template", "small", "--dry-run")
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.stdout.split())  # however the terminal wrapped it
    assert f"would wait, queued, at position 2: behind job {head.pk}, which comes" in said, said
    assert "under fifo no job starts before an earlier one (nothing was submitted)" in said
    assert Job.objects.count() == 2

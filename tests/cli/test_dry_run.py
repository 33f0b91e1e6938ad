"""manta submit --dry-run: what the submission would do, and nothing submitted."""

from __future__ import annotations

import json

from jobs.models import Job


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

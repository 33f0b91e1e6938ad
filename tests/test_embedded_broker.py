"""The embedded default (no CELERY_BROKER_URL, no DATABASE_URL): every process that loads the
settings — the API, `make worker`, `manage.py shell` — has the filesystem broker's folders and
can publish. Run in clean subprocesses, as `make serve` and `make worker` run."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PUBLISH = """
from config.celery import app
options = app.conf.broker_transport_options
print(options["data_folder_in"])
app.send_task("manta.probe", ("embedded-check",))
"""


def test_a_process_with_no_settings_in_its_environment_publishes_to_var(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    queue = Path(done.stdout.strip().splitlines()[-1])
    assert queue == tmp_path / "broker" / "queue"
    assert len(list(queue.iterdir())) == 1  # the message is there for a worker to take


READY = """
import json, shutil
import django
django.setup()
from django.conf import settings
from django.test import RequestFactory
from config.health import readyz
print(readyz(RequestFactory().get("/readyz")).status_code)
shutil.rmtree(settings.VAR_DIR / "broker" / "queue")  # a publish would fail now
response = readyz(RequestFactory().get("/readyz"))
print(response.status_code, json.loads(response.content)["checks"]["broker"])
"""


def test_readyz_says_the_embedded_broker_cannot_take_messages(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "MANTA_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    done = subprocess.run(
        [sys.executable, "-c", READY], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = done.stdout.strip().splitlines()[-2:]
    assert before == "200"
    assert after.startswith("503 error:") and "not writable" in after, after

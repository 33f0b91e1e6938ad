import json
import subprocess
import sys
from pathlib import Path

from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[1]


def test_healthz():
    assert APIClient().get("/healthz").json() == {"status": "ok"}


def test_readyz_checks_database_and_broker(db):
    response = APIClient().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


UNREACHABLE = """
import json
import django
django.setup()
from django.test import RequestFactory
from config.health import readyz
response = readyz(RequestFactory().get("/readyz"))
print(response.status_code, response.content.decode())
"""


def test_readyz_names_no_internal_host(tmp_path):
    """A probe answers anyone: when PostgreSQL and Redis are away it says what failed, never
    where they live."""
    env = {
        "PATH": "/usr/bin:/bin",
        "MANTA_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": "postgres://manta:s3cret@127.0.0.1:9/internaldb",
        "CELERY_BROKER_URL": "redis://:s3cret@127.0.0.1:9/0",
    }
    done = subprocess.run(
        [sys.executable, "-c", UNREACHABLE], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    status, body = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert status == "503"
    checks = json.loads(body)["checks"]
    assert checks["database"].startswith("error:") and checks["broker"].startswith("error:")
    for secret in ("127.0.0.1", ":9", "internaldb", "manta", "s3cret"):
        assert secret not in body, (secret, body)


def test_session_and_csrf_cookies_are_secure_unless_debug():
    from django.conf import settings

    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE

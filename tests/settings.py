"""Test settings: the real PostgreSQL and Redis on localhost, never the embedded SQLite."""

import os
import urllib.parse

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("MANTA_VAR_DIR", "/tmp/manta-test-var")
# The sweep stops local clusters no attempt owns: never those of a Manta running beside.
os.environ.setdefault("MANTA_LOCAL_RAY_DIR", "/tmp/manta-test-ray")
# Tests serve their own git repositories on 127.0.0.1 (git daemon): the code source policy lets
# loopback and git:// through here, for this process and the workers it starts.
os.environ.setdefault("MANTA_CODE_SOURCE_ALLOWED_NETWORKS", "127.0.0.0/8")
os.environ.setdefault("MANTA_CODE_SOURCE_ALLOW_PLAIN", "true")
# Tests log in and submit far faster than anyone may: the throttles still run (and count), at
# rates no test reaches; here and in the servers the end-to-end tests start. Only
# tests/test_throttling.py sets real ones.
os.environ.setdefault("MANTA_THROTTLE_LOGIN_IP", "100000/s")
os.environ.setdefault("MANTA_THROTTLE_LOGIN_ACCOUNT", "100000/s")
os.environ.setdefault("MANTA_THROTTLE_TOKENS", "100000/s")
os.environ.setdefault("MANTA_THROTTLE_SUBMIT_USER", "100000/s")
os.environ.setdefault("MANTA_THROTTLE_SUBMIT_WORKSPACE", "100000/s")
os.environ.setdefault("MANTA_THROTTLE_PACKAGE_UPLOAD", "100000/s")


def _split_for_xdist() -> None:
    """`make test` runs the tests that start no cluster in two pytest-xdist processes: each gets
    its own Redis database (broker and cache), var dir and Ray dir, as pytest-django gives each
    its own PostgreSQL database. Applied once: a server a test starts inherits the result."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", …
    if not worker or os.environ.get("MANTA_TESTS_SPLIT") == worker:
        return
    os.environ["MANTA_TESTS_SPLIT"] = worker
    for name in ("MANTA_VAR_DIR", "MANTA_LOCAL_RAY_DIR"):
        os.environ[name] = f"{os.environ[name]}-{worker}"
    broker = urllib.parse.urlsplit(os.environ["CELERY_BROKER_URL"])
    db = (int(broker.path.strip("/") or 0) - int(worker.removeprefix("gw"))) % 16
    os.environ["CELERY_BROKER_URL"] = broker._replace(path=f"/{db}").geturl()


_split_for_xdist()

from config.settings import *  # noqa: E402, F403
from config.settings import DATABASES  # noqa: E402

# The audit table refuses TRUNCATE unless this session setting is on; the test runner flushes
# the database between transactional tests, so its connections turn it on. Tests that prove the
# trigger open a plain connection without it.
DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c manta.audit_maintenance=on"
# A connection per request, as before persistent connections were the default: tests flush and
# reconnect between themselves (tests/test_db_connections.py covers persistence).
DATABASES["default"]["CONN_MAX_AGE"] = 0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only
SECRET_KEY = "tests"

# Most tests are about organisations' quotas, not this machine's size: the local host's own
# capacity does not bind them (tests/quotas/test_host_capacity.py sets it where it matters).
MANTA_LOCAL_CAPACITY = {"cpu": 1e6, "memory_gb": 1e6, "disk_gb": 1e6}

# A job's detail predicts its start afresh on every read here: tests move jobs between reads and
# expect the answer to follow (tests/jobs/test_prediction.py covers the cache itself).
MANTA_PREDICTION_CACHE_SECONDS = 0

"""Broker and database outages, for real: a Celery worker (with its beat) on PostgreSQL, a Redis
of the test's own, the API under gunicorn, and one Ray head that the workspace's `ray` compute
target points at (a job is one submission to it, not a cluster of its own, so twenty jobs take
seconds). No mocks.

* Redis dies while the worker holds unacknowledged messages: the worker reconnects, it does
  not exit (the AttributeError that ``config/celery.py`` works around).
* Redis is away for 30 s (killed, then started again empty; or frozen) while jobs are submitted:
  every submission answers 201, well within gunicorn's timeout, and once Redis is back every
  job succeeds (the sweep re-sends what the outage lost).
* PostgreSQL's backends are terminated while jobs run: the API answers the next requests, the
  worker carries on and the jobs succeed.

The API runs as its own gunicorn process rather than through the test client: it then has its
own Celery producer, on the test's Redis, and its own persistent database connections — what an
outage hits in production. This process's producer is pointed at the test's Redis as well, for
what the tests' own setup sends.
"""

from __future__ import annotations

import time

import kombu.pools
import pytest
import redis
from django.db import connection

from config.celery import app
from jobs.models import Job, JobEvent
from tests.conftest import build_world
from tests.e2e.conftest import Worker, start_worker
from tests.e2e.servers import Api, RayHead, RedisServer, wait_until

# Submissions during an outage must answer within a bound: not while another test loads the CPUs.
pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.whole_host]

ORG = "/api/v1/orgs/acme/"
WS = ORG + "workspaces/ml/"
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
OUTAGE_SECONDS = 30


def point_producer_at(url: str | None) -> None:
    """This process's Celery producer publishes to ``url`` from now on (None: the settings'
    broker again). ``broker_write_url``, not ``broker_url``: Celery reads the latter from the
    CELERY_BROKER_URL environment variable first, which the test settings set. kombu's pools
    are reset (closed and forgotten, so the next send builds new ones): pools only emptied
    still count their connections as lent, and a later send waits for one forever."""
    kombu.pools.reset()
    app._pool = app.amqp._producer_pool = None
    app.conf.broker_write_url = url


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    try:
        head.start()
        yield head
    finally:
        killed = head.stop()
        assert not head.processes(), f"Ray processes still running: {head.processes()}"
        print(f"Ray head stopped; SIGKILL was needed for {killed or 'none of its processes'}")


@pytest.fixture
def broker(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    point_producer_at(server.url)
    yield server
    point_producer_at(None)
    server.stop()


def faults_worker(tmp_path_factory, broker: RedisServer, **extra_env: str) -> Worker:
    """A worker (with beat) on the test's Redis that may reach the test's Ray head."""
    db = connection.settings_dict
    env = {
        # Named, so pg_stat_activity says whose connection was terminated.
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        "?application_name=manta-worker",
        "MANTA_LOCAL_RAY_DIR": str(tmp_path_factory.mktemp("no-local-clusters")),
        "MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS": "127.0.0.1/32",
        "MANTA_SWEEP_INTERVAL_SECONDS": "2",
        "MANTA_HEARTBEAT_STALE_SECONDS": "6",
        "MANTA_LEASE_SECONDS": "6",
        "MANTA_FOLLOW_INTERVAL_SECONDS": "0.5",
        **extra_env,
    }
    return start_worker(tmp_path_factory, "faults-worker", broker=broker.url, **env)


@pytest.fixture
def worker(django_db_setup, tmp_path_factory, broker) -> Worker:
    proc = faults_worker(tmp_path_factory, broker)
    yield proc
    proc.stop()


@pytest.fixture
def api(worker, tmp_path):
    # Persistent connections, health-checked (config/settings.py): what the database test hits.
    database = worker.env["DATABASE_URL"].replace("manta-worker", "manta-api")
    env = {**worker.env, "CONN_MAX_AGE": "60", "DATABASE_URL": database}
    server = Api(env, tmp_path / "api.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def world(transactional_db, broker):
    yield build_world()
    connection.close()


@pytest.fixture
def ray_target(world, api, ray_head):
    """The workspace's jobs go to the test's Ray head (a `ray` compute target)."""
    owner = world.tokens["owner"]
    target = {"name": "faults-ray", "kind": "ray",
              "config": {"address": ray_head.address, "token": ray_head.token}}  # fmt: skip
    response = api.call(owner, "POST", ORG + "compute-targets/", target)
    assert response.status_code == 201, response.text
    response = api.call(owner, "PATCH", WS, {"compute_target": "faults-ray"})
    assert response.status_code == 200, response.text


def sleeper(world, api: Api, seconds: float) -> int:
    """A template whose entrypoint sleeps, so its jobs are running when a fault strikes."""
    template = {
        "name": f"sleeps-{seconds:g}",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": f"python -c \"import time; time.sleep({seconds}); print('done')\"",
        "head": {"cpu": 0, "memory_gb": 0},
        "max_runtime_seconds": 300,
    }
    response = api.call(world.tokens["ws_admin"], "POST", WS + "templates/", template)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def alive(worker: Worker) -> bool:
    """The worker's main process has not exited; fails the test with its log if it has."""
    code = worker.proc.poll()
    assert code is None, f"the worker exited ({code}):\n{worker_log(worker)[-4000:]}"
    return True


def worker_log(worker: Worker) -> str:
    return worker.log_path.read_text(errors="replace")


def states(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))


def wait_for_jobs(worker: Worker, ids: list[int], wanted: set[str], timeout: float) -> None:
    def done() -> bool:
        alive(worker)
        return all(state in wanted for state in states(ids).values())

    def what() -> str:
        stuck = {pk: s for pk, s in states(ids).items() if s not in wanted}
        events = JobEvent.objects.filter(job_id__in=stuck).values_list("job_id", "kind", "reason")
        return f"jobs not yet {wanted}: {stuck}\nevents: {list(events)[-20:]}"

    wait_until(done, timeout, what, interval=0.5)


def test_worker_holding_unacked_messages_survives_redis_dying(world, broker, tmp_path_factory):
    """The reported crash: an idle worker (its beat quiet) holds ETA messages, unacknowledged,
    with its BRPOP in flight, when Redis dies. It must reconnect once Redis is back and run
    tasks again. Without the shim in config/celery.py the worker exits in about three of four
    such outages (it depends on which dead socket it reads first), so there are two."""
    quiet = {"MANTA_SWEEP_INTERVAL_SECONDS": "3600", "WEBHOOK_SWEEP_INTERVAL_SECONDS": "3600"}
    worker = faults_worker(tmp_path_factory, broker, **quiet)
    log = lambda: worker_log(worker)  # noqa: E731
    client = redis.Redis.from_url(broker.url)
    try:
        for outage in range(1, 3):
            for n in range(3):
                app.send_task("manta.probe", (f"faults:eta-{outage}-{n}",), countdown=600)
            wait_until(lambda o=outage: log().count("manta.probe") >= 3 * o, 30,
                       lambda: log()[-3000:])  # fmt: skip
            broker.kill()
            wait_until(lambda o=outage: log().count("Connection to broker lost") >= o, 30,
                       lambda: log()[-3000:])  # fmt: skip
            time.sleep(2)
            broker.start()  # a fresh, empty Redis on the same port
            wait_until(lambda o=outage: alive(worker) and log().count("Connected to") > o, 60,
                       lambda: log()[-3000:])  # fmt: skip
            app.send_task("manta.probe", (f"faults:probe-{outage}",))
            wait_until(lambda o=outage: alive(worker) and client.get(f"faults:probe-{o}"), 30,
                       lambda: log()[-3000:])  # fmt: skip
        assert "Unrecoverable error" not in log()
    finally:
        worker.stop()


# restart: Redis is killed and a new, empty one starts on its port 30 s later (every message
# lost; the API's sends are refused at once). freeze: SIGSTOP for 30 s (messages kept; every
# send waits for its socket timeout, so fewer submissions fit in the outage).
# The case (20 jobs, Redis stopped for 30 s), and a hung Redis (it accepts connections
# and never answers), which needs fewer jobs to show that submissions still return in time.
@pytest.mark.parametrize(
    ("outage", "total", "submitted_during", "slowest_allowed", "seconds"),
    [("restart", 20, 15, 5.0, OUTAGE_SECONDS), ("freeze", 6, 2, 25.0, 15)],
)
def test_jobs_submitted_while_redis_is_away_all_succeed(
    world, broker, worker, api, ray_target, outage, total, submitted_during, slowest_allowed,
    seconds,
):  # fmt: skip
    developer, template = world.tokens["developer"], sleeper(world, api, 5)

    def submit() -> tuple[int, float]:
        started = time.monotonic()
        response = api.call(developer, "POST", WS + "jobs/", {"template": template})
        assert response.status_code == 201, response.text
        return response.json()["id"], time.monotonic() - started

    before = [submit()[0] for _ in range(total - submitted_during)]
    wait_for_jobs(worker, before[:1], {"running"}, timeout=120)  # work in flight

    broker.kill() if outage == "restart" else broker.freeze()
    began = time.monotonic()
    during = [submit() for _ in range(submitted_during)]
    while time.monotonic() - began < seconds:
        alive(worker)
        time.sleep(0.5)
    broker.start() if outage == "restart" else broker.thaw()
    back = time.monotonic()

    ids = before + [pk for pk, _ in during]
    wait_for_jobs(worker, ids, TERMINAL, timeout=240)
    assert set(states(ids).values()) == {"succeeded"}, states(ids)
    log = worker_log(worker)
    assert "Unrecoverable error" not in log
    assert outage == "freeze" or "Connection to broker lost" in log
    took = [round(seconds, 1) for _, seconds in during]
    # Under gunicorn's 30 s worker timeout, with room to spare on a loaded 2-core machine.
    assert max(took) < slowest_allowed, took
    print(f"{outage}: submissions during the outage took {took} s; outage {back - began:.0f} s; "
          f"all {total} succeeded {time.monotonic() - back:.1f} s after Redis")  # fmt: skip


def terminate_backends() -> list[str]:
    """Terminate every other connection to the test database (the worker's, the API's, beat's);
    returns their application names. This process's own connection is the one asking."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [name for name, terminated in cursor.fetchall() if terminated]


def test_database_backends_terminated_while_jobs_run(world, broker, worker, api, ray_target):
    viewer, developer = world.tokens["viewer"], world.tokens["developer"]
    template = sleeper(world, api, 15)
    ids = []
    for _ in range(6):
        response = api.call(developer, "POST", WS + "jobs/", {"template": template})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    wait_for_jobs(worker, ids, {"running"}, timeout=120)

    terminated = []
    for _ in range(3):
        for _ in range(4):  # the API's processes hold their connections (CONN_MAX_AGE)
            api.call(viewer, "GET", WS + "jobs/")
        terminated += terminate_backends()
        for _ in range(4):
            response = api.call(viewer, "GET", WS + "jobs/")
            assert response.status_code == 200, response.text
        assert world.client("viewer").get(WS + "jobs/").status_code == 200
        alive(worker)
        time.sleep(1)
    assert "manta-api" in terminated, terminated

    wait_for_jobs(worker, ids, TERMINAL, timeout=180)
    assert set(states(ids).values()) == {"succeeded"}, states(ids)
    assert "Unrecoverable error" not in worker_log(worker)
    print(f"terminated backends: {sorted(terminated)}")

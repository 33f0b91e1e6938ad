"""A real Prometheus (Debian's) scrapes the API under gunicorn and the real Celery worker's own
exporter, both with the bearer token, every second, through one scripted scenario on real local
Ray clusters; then, through Prometheus's HTTP API, each metric family has the values the
scenario implies, every expression of the Grafana dashboard and of the alert rules returns
data (or the test says why it must be empty now), ``promtool check rules`` passes, and the
stuck-job alert fires for a job held in ``launching``.

The scenario launches three clusters, the fewest that show everything: A (research, borrowing
the GPUs ml is guaranteed) runs; B (ml, higher priority) preempts it, fails, is retried and fails
again; A, back in the queue, is cancelled. Beside them, with no cluster: a job held in
``launching`` (moved there by the state machine, never launched), a review workspace whose one
job is rejected and another waits for approval, and two webhook endpoints, one answering 200
and one 500.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from django.db import connection, transaction

from audit.context import Actor
from jobs.state import transition
from notifications import services as webhooks
from tests.conftest import build_world
from tests.e2e.conftest import ROOT, start_launch_worker
from tests.e2e.servers import Api, free_ports, wait_until
from tests.e2e.test_launch import py
from tests.factories import JobFactory
from tests.notifications.conftest import Receiver
from workspaces import services as ws_services

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

TOKEN = "prometheus-scrape-token-0123456789"
ORG = "/api/v1/orgs/acme/"
RULES = ROOT / "observability/prometheus/alerts.yml"
DASHBOARD = ROOT / "observability/grafana/manta.json"
STUCK_AFTER = 4  # seconds: the rendered rule's threshold and `for:` (the shipped one: 900 s, 5m)


class Prometheus:
    """``/usr/bin/prometheus`` on a free loopback port with its own data directory; started
    and stopped by pid."""

    def __init__(self, workdir: Path, targets: dict[str, list[str]], rules: Path):
        self.workdir = workdir
        [port] = free_ports(1)
        self.base = f"http://127.0.0.1:{port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "authorization": {"type": "Bearer", "credentials": TOKEN},
                    "static_configs": [{"targets": addresses}],
                }
                for job, addresses in targets.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc = None

    def start(self) -> None:
        log = open(self.workdir / "prometheus.log", "a")  # noqa: SIM115  (kept while it runs)
        self.proc = subprocess.Popen(
            ["/usr/bin/prometheus", f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address={self.base[7:]}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

        def ready() -> bool:
            assert self.proc.poll() is None, self.log()
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{self.base}/-/ready", timeout=2).ok
            return False

        wait_until(ready, 30, lambda: f"prometheus did not start:\n{self.log()}")

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-3000:]

    def query(self, expr: str) -> list[dict]:
        response = requests.get(f"{self.base}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        assert response.ok and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The value of a query that returns at most one series."""
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict]:
        return requests.get(f"{self.base}/api/v1/alerts", timeout=10).json()["data"]["alerts"]

    def targets_up(self) -> dict[str, str]:
        active = requests.get(f"{self.base}/api/v1/targets", timeout=10).json()["data"]
        health: dict[str, set[str]] = {}
        for target in active["activeTargets"]:
            health.setdefault(target["labels"]["job"], set()).add(target["health"])
        return {job: "/".join(sorted(states)) for job, states in health.items()}

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def rendered_rules(path: Path) -> Path:
    """The shipped rules, with the stuck-launching rule's threshold and `for:` shortened for the
    test; its expression is otherwise the one shipped."""
    rules = yaml.safe_load(RULES.read_text())
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "MantaJobStuckLaunching":
            shipped = rule["expr"]
            rule["expr"] = re.sub(r">\s*900$", f"> {STUCK_AFTER}", shipped.strip())
            assert rule["expr"] != shipped.strip(), "the stuck rule's threshold moved"
            rule["for"] = f"{STUCK_AFTER}s"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, ray_work_dir, tmp_path_factory):
    """The workers (the job lifecycle's and the webhooks', each with its exporter on), the API
    under gunicorn, and Prometheus scraping them all."""
    worker_port, webhooks_port = free_ports(2)
    worker = start_launch_worker(
        tmp_path_factory,
        ray_work_dir,
        webhooks_env={"MANTA_WORKER_METRICS_PORT": str(webhooks_port)},
        MANTA_WORKER_METRICS_PORT=str(worker_port),
        MANTA_METRICS_TOKEN=TOKEN,
        # not loopback: Prometheus (on loopback) gets in with the token only
        MANTA_METRICS_ALLOWED_NETWORKS="192.0.2.0/24",
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
        WEBHOOK_ALLOW_HTTP="true",
        WEBHOOK_TIMEOUT_SECONDS="2",
        WEBHOOK_SWEEP_INTERVAL_SECONDS="1",
        WEBHOOK_RETRY_SCHEDULE="0,1,1,1",
        WEBHOOK_RETRY_JITTER="0",
    )
    workdir = tmp_path_factory.mktemp("prometheus")
    env = {k: v for k, v in worker.env.items() if k != "MANTA_WORKER_METRICS_PORT"}
    api = Api(env, workdir / "api.log")
    prometheus = Prometheus(
        workdir,
        {
            "manta-api": [api.base[7:]],
            "manta-worker": [f"127.0.0.1:{port}" for port in (worker_port, webhooks_port)],
        },
        rendered_rules(workdir / "alerts.yml"),
    )
    try:
        api.start()
        prometheus.start()
        yield api, prometheus, worker_port
    finally:
        prometheus.stop()
        api.stop()
        worker.stop()


@pytest.fixture
def world(stack, transactional_db, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    yield build_world()
    connection.close()


def template(client, ws: str, entrypoint: str, *, gpu: int, priority: int = 5, retries: int = 0):
    body = {
        "name": f"gpu-{gpu}-p{priority}",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": entrypoint,
        "head": {"cpu": 0, "memory_gb": 1},
        "worker_groups": [{"name": "w", "replicas": 1, "cpu": 1, "memory_gb": 1, "gpu": gpu}],
        "max_runtime_seconds": 600,
        "max_retries": retries,
        "priority": priority,
    }
    response = client.post(f"{ORG}workspaces/{ws}/templates/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def job_state(api: Api, token: str, ws: str, job: int) -> str:
    return api.call(token, "GET", f"{ORG}workspaces/{ws}/jobs/{job}/").json()["state"]


# The fewest samples any series of ml's job failures has (scraped once a second).
FAILURE_SAMPLES = 'min(count_over_time(manta_job_failures_total{workspace="ml"}[1h]))'


def test_prometheus_sees_the_scenario(world, stack):
    api, prometheus, _ = stack
    owner, admin = world.tokens["owner"], world.tokens["org_admin"]
    actor = Actor.for_user(world.users["owner"])
    console = world.client("owner")
    for slug in ("research", "review"):
        ws_services.workspace_create(actor=actor, organization=world.org, slug=slug)
    review = world.org.workspaces.get(slug="review")
    ws_services.workspace_update(actor=actor, workspace=review, data={"approval_policy": "always"})
    quota = {"gpu": 2, "policy": "fifo", "preemption": True}
    assert api.call(owner, "PATCH", f"{ORG}quota/", quota).status_code == 200
    for ws, body in (
        ("ml", {"guaranteed_gpu": 2, "limit_gpu": 2}),
        ("research", {"guaranteed_gpu": 0, "limit_gpu": 2, "gpu_hours_per_month": 50}),
    ):
        response = api.call(owner, "PATCH", f"{ORG}workspaces/{ws}/quota/", body)
        assert response.status_code == 200, response.content

    # the job held in launching: moved there by the state machine, never launched (no attempt)
    with transaction.atomic():
        held = JobFactory(workspace=world.ws, state="queued")
        transition(held.pk, "launching", actor=Actor.system("tests"))
    # webhooks: one endpoint answers 200, the other 500
    ok, failing = Receiver(), Receiver()
    failing.default = (500, {}, b"down")
    for receiver, types in ((ok, ["*"]), (failing, ["job.running", "job.failed"])):
        webhooks.webhook_create(actor=actor, organization=world.org, workspace=None,
                                url=receiver.url(), event_types=types)  # fmt: skip

    # review: one job rejected (approval wait), one left waiting for approval
    idle = template(console, "review", py("print(1)"), gpu=0)
    waiting = []
    for _ in range(2):
        response = api.call(admin, "POST", f"{ORG}workspaces/review/jobs/", {"template": idle})
        assert response.status_code == 201, response.content
        waiting.append(response.json()["id"])
    response = api.call(owner, "POST", f"{ORG}workspaces/review/jobs/{waiting[0]}/reject/",
                        {"reason": "not this week"})  # fmt: skip
    assert response.status_code == 200, response.content

    # A borrows research's way into ml's GPUs and runs until preempted
    running_long = py("import time; print('A', flush=True); time.sleep(600)")
    borrower = template(console, "research", running_long, gpu=2)
    response = api.call(owner, "POST", f"{ORG}workspaces/research/jobs/", {"template": borrower})
    assert response.status_code == 201, response.content
    a = response.json()["id"]
    wait_until(lambda: job_state(api, owner, "research", a) == "running", 180,
               lambda: f"A is {job_state(api, owner, 'research', a)}")  # fmt: skip
    # B takes the guarantee back, runs, fails, is retried once and fails again
    failing_run = py("import time; print('B', flush=True); time.sleep(2); raise SystemExit(1)")
    owner_tpl = template(console, "ml", failing_run, gpu=2, priority=9, retries=1)
    response = api.call(owner, "POST", f"{ORG}workspaces/ml/jobs/", {"template": owner_tpl})
    assert response.status_code == 201, response.content
    b = response.json()["id"]
    wait_until(
        lambda: job_state(api, owner, "research", a) == "queued", 60, lambda: "no preemption"
    )
    response = api.call(owner, "POST", f"{ORG}workspaces/research/jobs/{a}/cancel/", {})
    assert response.status_code == 200, response.content
    wait_until(lambda: job_state(api, owner, "ml", b) == "failed", 240,
               lambda: f"B is {job_state(api, owner, 'ml', b)}")  # fmt: skip
    wait_until(
        lambda: len(ok.requests) >= 3 and len(failing.requests) >= 3,
        30,
        lambda: f"deliveries: {len(ok.requests)} ok, {len(failing.requests)} failing",
    )

    # --- what Prometheus saw ------------------------------------------------------------------
    assert prometheus.targets_up() == {"manta-api": "up", "manta-worker": "up"}
    q, v = prometheus.query, prometheus.value

    def settled() -> bool:  # the sweep's snapshot and the last counts reached a scrape
        failed = v('sum(manta_webhook_deliveries_total{outcome="failed"})') or 0
        return (
            v('manta_jobs{workspace="ml", state="failed"}') == 1
            and v('manta_jobs{workspace="research", state="cancelled"}') == 1
            and failed >= 3
            # the worker's counters of that failure are scraped apart from the API's levels,
            # each twice at least: the dashboard's increase() needs two samples of a series
            and (v(FAILURE_SAMPLES) or 0) >= 2
        )

    wait_until(settled, 30, lambda: "the last levels never reached Prometheus")
    ml, research = (
        'organization="acme", workspace="ml"',
        'organization="acme", workspace="research"',
    )
    # jobs by state and why they wait
    assert v(f'manta_jobs{{{ml}, state="launching"}}') == 1  # the held one
    assert v('manta_jobs{workspace="review", state="rejected"}') == 1
    assert v('manta_jobs{workspace="review", state="pending_approval"}') == 1
    assert v('manta_pending_jobs{workspace="review", reason="approval"}') == 1
    assert v('sum(manta_pending_jobs{reason!="approval"})') == 0
    # admission (A1, B1, B2) and approval waits, launch phases, run time
    assert v(f"sum(manta_admission_wait_seconds_count{{{research}}})") == 1
    assert v(f"sum(manta_admission_wait_seconds_count{{{ml}}})") == 2
    assert v('manta_approval_wait_seconds_count{workspace="review", decision="rejected"}') == 1
    for phase in ("cluster_start", "submit"):
        assert v(f'sum(manta_launch_phase_seconds_count{{phase="{phase}"}})') == 3, phase
    cluster_start = v('sum(manta_launch_phase_seconds_sum{phase="cluster_start"})')
    assert 1 < cluster_start < 300
    assert v(f'manta_job_run_seconds_count{{{research}, outcome="preempted"}}') == 1
    # evictions, preemptions, retries, failures (no cluster was lost: that family is absent)
    assert v(f'manta_job_preemptions_total{{{research}, reason="guarantee_reclaimed"}}') == 1
    assert v(f'manta_job_evictions_total{{{research}, reason="preempted"}}') == 1
    assert v(f'manta_job_evictions_total{{{ml}, reason="entrypoint_failed"}}') == 1
    assert v(f'manta_job_retries_total{{{ml}, reason="entrypoint_failed"}}') == 1
    assert v(f'manta_job_failures_total{{{ml}, reason="entrypoint_failed"}}') == 1
    assert q("manta_cluster_lost_total") == []
    assert v('sum(manta_job_transitions_total{to_state="launching"})') == 3
    assert v('sum(manta_job_transitions_total{to_state="cancelled", job="manta-api"})') == 1
    # quota, reservations (A held research's 2 GPUs while it ran), GPU-hours and budget
    assert v(f'manta_quota_guaranteed{{{ml}, resource="gpu"}}') == 2
    assert v(f'manta_quota_limit{{{research}, resource="gpu"}}') == 2
    assert v(f'max_over_time(manta_quota_reserved{{{research}, resource="gpu"}}[10m])') == 2
    assert v(f'manta_quota_reserved{{{research}, resource="gpu"}}') == 0
    assert v('manta_org_capacity{organization="acme", resource="gpu"}') == 2
    assert 0 < v(f"manta_gpu_hours_used{{{research}}}") < 0.5
    assert v(f"manta_gpu_hours_budget{{{research}}}") == 50
    assert v('manta_quota_drift{kind="missing_reservations"}') == 1  # the held job holds nothing
    # webhooks: the 200 endpoint succeeds, the 500 one fails, each with its latency
    assert v('sum(manta_webhook_deliveries_total{outcome="succeeded"})') >= 3
    assert v('sum(manta_webhook_deliveries_total{outcome="failed"})') >= 3
    assert v('sum(manta_webhook_delivery_latency_seconds_count{outcome="succeeded"})') >= 3
    # Celery: tasks waited and ran in the worker's pool; the queue; the sweep's heartbeat
    launches = 'manta_celery_task_wait_seconds_count{task="manta.jobs.launch_attempt"}'
    assert v(launches) == 3
    assert v('sum(manta_celery_task_runtime_seconds_count{task="manta.jobs.sweep"})') >= 1
    assert v('manta_celery_queue_depth{queue="celery"}') >= 0
    assert v("time() - manta_worker_heartbeat_timestamp_seconds") < 15
    # HTTP by route and status, with latency, from the gunicorn workers
    submitted = 'sum(manta_http_requests_total{method="POST", route=~".*/jobs/", status="201"})'
    assert v(submitted) == 4
    assert v('sum(manta_http_request_duration_seconds_count{route=~".*/reject/"})') == 1
    # each worker counts its own processes: the lifecycle one (main, pool, beat) at least three
    assert v('max(manta_processes{job="manta-worker"})') >= 3
    assert v('manta_processes{job="manta-api"}') >= 1
    assert v('min(process_resident_memory_bytes{job="manta-worker"})') > 50e6
    assert v('process_cpu_seconds_total{job="manta-api"}') > 0

    # --- every expression of the dashboard and of the rules -----------------------------------
    empty = []
    for expr in dashboard_expressions():
        if not q(expr):
            empty.append(expr)
    assert not empty, f"dashboard expressions with no data: {empty}"
    rules = {r["alert"]: r["expr"] for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    assert set(rules) == set(QUIET) | FIRING
    for alert, expr in rules.items():
        if alert in FIRING:
            assert q(expr), f"{alert} has no data"
        else:
            assert not q(expr), f"{alert} should be quiet now: {QUIET[alert]}"
            signal = signal_of(expr)
            assert q(signal), f"{alert}: its signal {signal!r} has no data"
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

    # --- the held job's alert fires ----------------------------------------------------------
    def stuck_firing() -> list[dict]:
        alerts = prometheus.alerts()
        stuck = [a for a in alerts if a["labels"]["alertname"] == "MantaJobStuckLaunching"]
        return [a for a in stuck if a["state"] == "firing"]

    firing = wait_until(stuck_firing, 30, lambda: json.dumps(prometheus.alerts())[:2000])
    assert [(a["labels"]["organization"], a["labels"]["workspace"]) for a in firing] == [
        ("acme", "ml")
    ]
    ok.close()
    failing.close()


# Alerts whose shipped expression has data in this scenario.
FIRING = {
    "MantaQuotaDrift",  # the held job is launching without a reservation: missing_reservations
    "MantaWebhookEndpointFailing",  # the 500 endpoint failed every attempt
}
# Alerts that must be quiet now, and why; each one's signal (its expression without the final
# comparison) must still have data.
QUIET = {
    "MantaJobStuckLaunching": "the held job has launched for seconds, not 900 (the rendered "
    "rule, loaded in Prometheus, fires: checked below)",
    "MantaJobAwaitingApproval": "the review job has waited seconds, not a day",
    "MantaNoWorkerHeartbeat": "the worker's sweep ran seconds ago",
    "MantaTargetDown": "both targets answer",
    "MantaAdmissionWaitHigh": "every admission took seconds, not 30 minutes",
    "MantaGpuBudgetNearlySpent": "research used a few GPU-seconds of its 50 hours",
}


def signal_of(expr: str) -> str:
    """The expression without its final comparison (and without an `or absent(...)`)."""
    expr = re.sub(r"\s+or\s+absent\(.*\)\s*$", "", expr.strip(), flags=re.DOTALL)
    signal = re.sub(r"\s*(>|==|<)\s*[\d.]+\s*$", "", expr)
    assert signal != expr, f"no comparison at the end of {expr!r}"
    return signal


def dashboard_expressions() -> list[str]:
    """Every target's PromQL of the Grafana dashboard, with the template variables as Grafana
    sets them for "All" and a 1-minute rate interval."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 25
    substitutions = {"$organization": ".*", "$workspace": ".*", "$__rate_interval": "1m"}
    for name, value in substitutions.items():
        exprs = [e.replace(name, value) for e in exprs]
    assert not [e for e in exprs if "$" in e]
    return exprs

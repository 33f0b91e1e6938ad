"""`make demo`: the governed flow, end to end, on the embedded default.

Fresh SQLite database and filesystem broker under var/demo/, the API (gunicorn) and a Celery worker
started in the background on 127.0.0.1, then a short real scenario over HTTP. Everything started
here is stopped at the end, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var" / "demo"
PY = sys.executable
PASSWORD = "demo-password-123"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ENV = {
    **os.environ,
    "DJANGO_SETTINGS_MODULE": "config.settings",
    "MANTA_VAR_DIR": str(VAR),
    "DATABASE_URL": f"sqlite:///{VAR / 'manta.sqlite3'}",
    "CELERY_BROKER_URL": "filesystem://",
    "MANTA_LOCAL_RAY_DIR": "/tmp/manta-demo",
    "PYTHONUNBUFFERED": "1",
    # the demo's webhook receiver listens on this host, over plain http
    "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    "WEBHOOK_ALLOW_HTTP": "true",
}


def choose_isolation() -> str:
    """The sandbox where this host can build one (root, namespaces, cgroups); otherwise the
    single-user mode, said out loud, so the demo runs on a laptop too."""
    chosen = os.environ.get("MANTA_LOCAL_ISOLATION")
    if not chosen:
        sys.path.insert(0, str(ROOT))
        from jobs.launchers.local.isolation import SandboxSettings, host_support

        problems = host_support(SandboxSettings())
        chosen = "off" if problems else "sandbox"
        if problems:
            print("    this host cannot sandbox tenant jobs:", "; ".join(problems))
    ENV["MANTA_LOCAL_ISOLATION"] = chosen
    if chosen == "sandbox":
        print("    isolation: sandbox (own uid, namespaces, cgroups for every cluster)")
    else:
        print("    isolation: off (single-user mode: jobs run as this user and see this host)")
    return chosen


def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def manage(*args: str) -> str:
    done = subprocess.run(
        [PY, "manage.py", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


class Api:
    def __init__(self, base: str, token: str | None = None, who: str = ""):
        self.base, self.token, self.who = base, token, who

    def call(self, method: str, path: str, body=None, show=True, expect=None):
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = requests.request(
            method, self.base + path, json=body, headers=headers, timeout=30
        )
        if show:
            print(f"  [{self.who or 'anonymous'}] {method} {path} -> {response.status_code}")
        if expect is not None and response.status_code != expect:
            raise SystemExit(
                f"expected {expect}, got {response.status_code}: {response.text[:2000]}"
            )
        return response.json() if response.content else None


def brief(data, keys) -> str:
    return json.dumps({k: data.get(k) for k in keys})


class Services:
    """The background processes of the demo; stopped in reverse order."""

    def __init__(self):
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str]) -> None:
        log = open(VAR / f"{name}.log", "w")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(
            args, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append((name, proc))

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()  # the main process; it shuts its own children down
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything of its group left behind
            print(f"  stopped {name} (exit {proc.returncode})")


def wait_ready(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(base + "/readyz", timeout=10).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass
        time.sleep(0.3)
    raise SystemExit(f"the API did not become ready; see {VAR / 'api.log'}")


def scenario(base: str, owner_token: str, receiver_url: str) -> None:
    owner = Api(base, owner_token, "owner")

    step("The owner invites an org admin and a developer; each accepts with a password")
    for email, role in [("admin@demo.test", "admin"), ("dev@demo.test", "member")]:
        body = {"email": email, "org_role": role}
        invited = owner.call("POST", "/api/v1/orgs/demo/invitations/", body, expect=201)
        print("   ", brief(invited, ["id", "email", "org_role", "state"]))
        accept = {"token": invited["token"], "password": PASSWORD}
        joined = Api(base).call("POST", "/api/v1/invitations/accept/", accept, expect=200)
        print("   ", brief(joined, ["organization", "email", "org_role"]))

    step("Each signs in for an API token (shown once)")
    tokens = {}
    for email in ["admin@demo.test", "dev@demo.test"]:
        body = {"email": email, "password": PASSWORD, "name": "demo", "expires_in_days": 1}
        issued = Api(base).call("POST", "/api/v1/auth/tokens/", body, expect=201)
        tokens[email] = issued["token"]
        print("   ", email, "->", issued["token"][:10] + "…", f"(expires {issued['expires_at']})")
    admin = Api(base, tokens["admin@demo.test"], "admin")
    dev = Api(base, tokens["dev@demo.test"], "dev")

    step("The admin creates a workspace and grants the developer a role")
    body = {"slug": "ml-research", "name": "ML research", "description": "demo"}
    ws = admin.call("POST", "/api/v1/orgs/demo/workspaces/", body, expect=201)
    print("   ", brief(ws, ["slug", "name", "approval_policy", "compute_target"]))
    hook = register_webhook(admin, receiver_url)
    body = {"email": "dev@demo.test", "role": "developer"}
    member = admin.call("POST", "/api/v1/orgs/demo/workspaces/ml-research/members/", body, 201)
    print("   ", brief(member, ["id", "email", "role"]))

    step("The developer tries an admin's action, and is refused")
    body = {"email": "admin@demo.test", "role": "viewer"}
    refused = dev.call("POST", "/api/v1/orgs/demo/workspaces/ml-research/members/", body, 403)
    print("   ", json.dumps(refused))
    refused = dev.call("GET", "/api/v1/orgs/demo/audit-events/", expect=403)
    print("   ", json.dumps(refused))
    missing = Api(base).call("GET", "/api/v1/me/", expect=401)
    print("    without a token:", json.dumps(missing))

    job = jobs_flow(owner, admin, dev)
    show_result(dev, follow_job(dev, job["id"]))
    show_webhooks(admin, hook)

    step("The audit trail (newest first)")
    events = owner.call("GET", "/api/v1/orgs/demo/audit-events/?page_size=20", expect=200)
    for event in events["results"]:
        print(
            f"    #{event['seq']:<3} {event['action']:<18} by {event['actor']['label']:<22}"
            f" {event['target']['type']}:{event['target']['repr']}"
        )
    step("Verify the audit hash chain")
    verdict = owner.call("GET", "/api/v1/orgs/demo/audit-events/verify/", expect=200)
    print("   ", json.dumps(verdict))


HOOKS = "/api/v1/orgs/demo/workspaces/ml-research/webhooks/"
RECEIVED = VAR / "webhooks-received.jsonl"


def register_webhook(admin: Api, receiver_url: str) -> dict:
    step("The admin registers a webhook endpoint: a small receiver on this host")
    body = {"url": receiver_url, "event_types": ["*"], "description": "demo receiver"}
    hook = admin.call("POST", HOOKS, body, expect=201)
    print("   ", brief(hook, ["id", "url", "event_types", "enabled"]))
    print(f"    signing secret (shown once): {hook['secret'][:12]}…")
    # the receiver reads its secret from this file on every request, and verifies each message
    (VAR / "webhook-secret").write_text(hook["secret"])
    bad = admin.call("POST", HOOKS, {"url": "http://169.254.169.254/latest/"}, expect=400)
    print("    a URL into the cloud metadata service is refused:", bad["errors"]["url"][0])
    admin.call("POST", f"{HOOKS}{hook['id']}/ping/", expect=202)
    return hook


def show_webhooks(admin: Api, hook: dict) -> None:
    step("The receiver got the workspace's events, each signed (Standard Webhooks) and verified")
    deliveries: list = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the last events are a moment behind the job's end
        deliveries = admin.call("GET", f"{HOOKS}{hook['id']}/deliveries/", show=False)["results"]
        done = deliveries and all(d["state"] == "succeeded" for d in deliveries)
        if done and any(d["event_type"] == "job.succeeded" for d in deliveries):
            break
        time.sleep(0.5)
    received = [json.loads(line) for line in RECEIVED.read_text().splitlines()]
    for entry in received:
        body = json.loads(entry["body"])
        job = body["data"].get("job", {})
        what = f"job {job['id']} {job['state']}" if job else ""
        mark = "verified" if entry["verified"] else "NOT VERIFIED"
        stamp = body["timestamp"][11:23]
        print(f"    {stamp} {body['type']:<24} {entry['id'][:20]}… {mark} {what}")
    print(
        f"    {len(received)} messages received, {sum(e['verified'] for e in received)} verified;",
        f"{sum(d['state'] == 'succeeded' for d in deliveries)} deliveries recorded as succeeded",
    )
    if not received or not all(entry["verified"] for entry in received):
        raise SystemExit("a webhook delivery was missing or did not verify")
    step("Email notifications (console backend, in the worker's log)")
    for line in (VAR / "worker.log").read_text(errors="replace").splitlines():
        if line.startswith(("Subject: [Manta]", "To: ")):
            print("   ", line)


COUNTER_ENTRYPOINT = (
    'python -c "import os, ray; ray.init(); '
    "Counter = ray.remote(type('Counter', (), {'__init__': lambda self: setattr(self, 'n', 0), "
    "'inc': lambda self: setattr(self, 'n', self.n + 1) or self.n})); c = Counter.remote(); "
    "n = [ray.get(c.inc.remote()) for _ in range(int(os.environ['COUNT_TO']))][-1]; "
    "print('counter reached', n)\""
)


def jobs_flow(owner: Api, admin: Api, dev: Api) -> dict:
    ws = "/api/v1/orgs/demo/workspaces/ml-research"
    step("The admin publishes the counter template and asks for approval above 0.5 CPU")
    body = {
        "name": "counter",
        "description": "an actor that counts to COUNT_TO and prints it",
        "image": "rayproject/ray:2.60.0",
        "entrypoint": COUNTER_ENTRYPOINT,
        "runtime_env": {"env_vars": {"COUNT_TO": "10"}},
        # 2 GB of disk a node: the counter writes only Ray's own files
        "head": {"cpu": 0, "memory_gb": 1, "gpu": 0, "disk_gb": 2},
        "worker_groups": [
            {"name": "workers", "replicas": 1, "cpu": 1, "memory_gb": 1, "disk_gb": 2}
        ],
        "max_runtime_seconds": 300,
        "allowed_overrides": ["runtime_env", "priority"],
    }
    template = admin.call("POST", f"{ws}/templates/", body, expect=201)
    print("   ", brief(template, ["id", "name", "version", "allowed_overrides"]))
    policy = {"approval_policy": "threshold", "approval_thresholds": {"cpu": 0.5}}
    print("   ", brief(admin.call("PATCH", f"{ws}/", policy, expect=200), list(policy)))

    step("The developer submits a job in one call; it needs approval")
    body = {
        "template": template["id"],
        "name": "count-to-20",
        "overrides": {"runtime_env": {"env_vars": {"COUNT_TO": "20"}}},
    }
    job = dev.call("POST", f"{ws}/jobs/", body, expect=201)
    print("   ", brief(job, ["id", "state", "requested", "approval_reason"]))
    refused = dev.call("POST", f"{ws}/jobs/{job['id']}/approve/", {}, expect=403)
    print("    the developer approving it:", refused["type"], "-", refused["detail"])
    bad = dev.call(
        "POST",
        f"{ws}/jobs/",
        {"template": template["id"], "overrides": {"image": "evil/miner:1"}},
        expect=400,
    )
    print("    an override the template does not allow:", json.dumps(bad["errors"]))

    step("An approver may not approve their own job")
    own = admin.call("POST", f"{ws}/jobs/", {"template": template["id"]}, expect=201)
    refused = admin.call("POST", f"{ws}/jobs/{own['id']}/approve/", {}, expect=403)
    print("    admin approving their own job:", refused["type"], "-", refused["detail"])
    rejected = owner.call(
        "POST",
        f"{ws}/jobs/{own['id']}/reject/",
        {"reason": "duplicate of the developer's run"},
        expect=200,
    )
    print("    the owner rejects it:", brief(rejected, ["id", "state", "decision_reason"]))

    step("The admin approves the developer's job")
    approved = admin.call(
        "POST", f"{ws}/jobs/{job['id']}/approve/", {"reason": "fits the budget"}, expect=200
    )
    print("   ", brief(approved, ["id", "state", "decided_by", "decision_reason"]))
    return approved


def follow_job(dev: Api, job_id: int, timeout: float = 300) -> dict:
    ws = "/api/v1/orgs/demo/workspaces/ml-research"
    step("The worker admits it, launches a real local Ray cluster, and follows it")
    seen, deadline = None, time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = dev.call("GET", f"{ws}/jobs/{job_id}/", show=False)
        attempt = job["attempts"][-1] if job["attempts"] else {}
        now = (job["state"], attempt.get("state"), attempt.get("ray_status"))
        if now != seen:
            seen = now
            extra = f" cluster={attempt['cluster_name']}" if attempt.get("cluster_name") else ""
            if attempt.get("dashboard_url"):
                extra += f" dashboard={attempt['dashboard_url']}"
            print(
                f"    {time.strftime('%H:%M:%S')} job {job['state']:<10} "
                f"ray={attempt.get('ray_status') or '-':<9}{extra}"
            )
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise SystemExit(f"job {job_id} did not finish within {timeout:.0f}s")


def show_result(dev: Api, job: dict) -> None:
    ws = "/api/v1/orgs/demo/workspaces/ml-research"
    attempt = job["attempts"][-1]
    step(f"Result: {job['state']}")
    print("    submission id:", attempt["submission_id"])
    print("    phases (s):   ", json.dumps(attempt["phases"]))
    plan = dev.call("GET", f"{ws}/jobs/{job['id']}/launch-plan/", show=False)
    for node in plan["nodes"]:
        print(
            f"    node {node['role']:<6} {node['group']:<8}",
            json.dumps({k: v for k, v in node.items() if k not in ("role", "group", "index")}),
        )
    print("    isolation:    ", json.dumps(attempt["isolation"]))
    logs = dev.call("GET", f"{ws}/jobs/{job['id']}/logs/?tail=5", expect=200)
    print(f"    driver log ({logs['source']}, last lines):")
    for line in logs["logs"].splitlines():
        print("      |", line)
    show_timeline(dev, f"{ws}/jobs/{job['id']}/events/")
    if job["state"] != "succeeded":
        raise SystemExit(f"the demo job ended {job['state']}: {job['message']}")


def show_timeline(api: Api, url: str) -> None:
    step("The job's timeline")
    for event in api.call("GET", url, expect=200)["results"]:
        arrow = f"{event['from_state'] or '-'} -> {event['to_state']}"
        print(
            f"    {event['created_at'][11:23]} {event['kind']:<10} {arrow:<30}"
            f" by {event['actor']:<22} {event['reason']}"
        )


def main() -> None:
    shutil.rmtree(VAR, ignore_errors=True)
    VAR.mkdir(parents=True)
    step("Bootstrap: migrate the embedded SQLite database and create the demo organisation")
    manage("migrate", "--noinput")
    out = manage("create_org", "demo", "--owner", "owner@demo.test", "--password", PASSWORD)
    owner_token = out.strip().splitlines()[-1]
    print(f"    owner@demo.test token: {owner_token[:10]}…")
    choose_isolation()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    services = Services()
    try:
        step(f"Start the API on {base}")
        services.start(
            "api",
            [
                PY,
                "-m",
                "gunicorn",
                "config.wsgi",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                "2",
                "--access-logfile",
                "-",
            ],
        )
        services.start(
            "worker",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-B",
                "-l",
                "info",
                "--concurrency",
                "2",
                "-s",
                str(VAR / "beat-schedule"),
            ],
        )
        receiver_port = free_port()
        services.start(
            "receiver",
            [PY, "scripts/webhook_receiver.py", "--port", str(receiver_port),
             "--secret-file", str(VAR / "webhook-secret"), "--log", str(RECEIVED)],
        )  # fmt: skip
        wait_ready(base)
        print("    ready:", requests.get(base + "/readyz", timeout=5).json())
        print(f"    worker: celery (filesystem broker under {VAR / 'broker'}), logs in worker.log")
        print(f"    webhook receiver: http://127.0.0.1:{receiver_port}/hooks (receiver.log)")
        scenario(base, owner_token, f"http://127.0.0.1:{receiver_port}/hooks")
    finally:
        step("Stop everything the demo started")
        services.stop()
    print("\nDemo finished: logs are under", VAR)


if __name__ == "__main__":
    main()

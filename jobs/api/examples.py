"""The OpenAPI examples of the jobs API: what a request or response looks like, shown in the
schema and the interactive docs."""

from drf_spectacular.utils import OpenApiExample

COUNTER_SPEC = {
    "image": "rayproject/ray:2.60.0",
    "entrypoint": 'python -c "import ray; ray.init(); '
    "C = ray.remote(type('C', (), {'__init__': lambda s: setattr(s, 'n', 0), "
    "'inc': lambda s: setattr(s, 'n', s.n + 1) or s.n})); c = C.remote(); "
    "print('count', [ray.get(c.inc.remote()) for _ in range(10)][-1])\"",
    "runtime_env": {"env_vars": {"COUNT_TO": "10"}},
    "head": {"cpu": 0, "memory_gb": 2, "gpu": 0},
    "worker_groups": [
        {
            "name": "workers",
            "replicas": 1,
            "min_replicas": 0,
            "max_replicas": 2,
            "cpu": 1,
            "memory_gb": 1,
            "gpu": 0,
            "resources": {},
        }
    ],
    "max_runtime_seconds": 600,
    "max_retries": 0,
    "priority": 5,
    "ttl_seconds_after_finished": 300,
}


TEMPLATE_CREATE_INPUT = [
    OpenApiExample(
        "Counter template",
        value={
            "name": "counter",
            "description": "counts with an actor",
            **COUNTER_SPEC,
            "allowed_overrides": ["entrypoint", "worker_groups", "priority"],
        },
        request_only=True,
    )
]


TEMPLATE_UPDATE_INPUT = [
    OpenApiExample(
        "New version", value={"priority": 7, "max_runtime_seconds": 900}, request_only=True
    )
]


TEMPLATE_VERSION_OUTPUT = [
    OpenApiExample(
        "Version 1",
        value={
            "version": 1,
            "spec": COUNTER_SPEC,
            "allowed_overrides": ["priority"],
            "created_by": "admin@acme.test",
            "created_at": "2026-12-02T10:00:00Z",
        },
        response_only=True,
    )
]


TEMPLATE_OUTPUT = [
    OpenApiExample(
        "A template",
        value={
            "id": 1,
            "name": "counter",
            "description": "counts with an actor",
            "version": 2,
            "spec": COUNTER_SPEC,
            "allowed_overrides": ["entrypoint", "priority"],
            "created_at": "2026-12-02T10:00:00Z",
            "updated_at": "2026-12-02T11:00:00Z",
            "archived_at": None,
        },
        response_only=True,
    )
]


JOB_SUBMIT_INPUT = [
    OpenApiExample(
        "Submit with an override",
        value={"template": 1, "name": "count-to-20", "overrides": {"priority": 7}},
        request_only=True,
    )
]


REASON_INPUT = [
    OpenApiExample("With a reason", value={"reason": "approved for the demo"}, request_only=True)
]


JOB_LOGS_OUTPUT = [
    OpenApiExample(
        "After the attempt ended",
        value={"attempt": 1, "source": "archive", "logs": "counter reached 20\n"},
        response_only=True,
    )
]


JOB_OUTPUT = [
    OpenApiExample(
        "A job waiting for approval",
        value={
            "id": 42,
            "name": "counter",
            "state": "pending_approval",
            "template": {"id": 1, "name": "counter"},
            "template_version": 2,
            "spec": COUNTER_SPEC,
            "overrides": {"priority": 7},
            # on the local host's sandboxes: what they allow (each node at least 1 CPU, its
            # memory + 30 % object store + 1 GiB of Ray's own, 10 GB of disk)
            "requested": {"cpu": 2.0, "memory_gb": 5.9, "gpu": 0.0, "disk_gb": 20.0},
            "priority": 7,
            "submitted_by": "dev@acme.test",
            "approval_required": True,
            "approval_reason": "the workspace requires approval for every job",
            "decided_by": None,
            "decided_at": None,
            "decision_reason": "",
            "failure_reason": "",
            "message": "",
            "created_at": "2026-12-02T10:00:00Z",
            "queued_at": None,
            "started_at": None,
            "finished_at": None,
            "updated_at": "2026-12-02T10:00:00Z",
            "attempts": [],
        },
        response_only=True,
    )
]


JOB_EVENT_OUTPUT = [
    OpenApiExample(
        "An approval",
        value={
            "id": 7,
            "kind": "approved",
            "from_state": "pending_approval",
            "to_state": "queued",
            "actor": "admin@acme.test",
            "reason": "looks fine",
            "data": {},
            "created_at": "2026-12-02T10:05:00Z",
        },
        response_only=True,
    )
]


LAUNCH_PLAN_OUTPUT = [
    OpenApiExample(
        "local",
        value={
            "kind": "local",
            "cluster_name": "manta-acme-ml-42-1",
            "nodes": [
                {
                    "role": "head",
                    "group": "head",
                    "num_cpus": 0,
                    "num_gpus": 0,
                    "memory_bytes": 2147483648,
                    "resources": {},
                },
                {
                    "role": "worker",
                    "group": "workers",
                    "index": 0,
                    "num_cpus": 1,
                    "num_gpus": 0,
                    "memory_bytes": 1073741824,
                    "resources": {},
                },
            ],
            "submission": {
                "submission_id": "5d1c…",
                "entrypoint": "python main.py",
                "runtime_env": {},
                "entrypoint_num_cpus": 0,
            },
        },
        response_only=True,
    )
]


REJECT_INPUT = [OpenApiExample("Reject", value={"reason": "too many GPUs"}, request_only=True)]

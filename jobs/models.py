"""Job templates (versioned), jobs and their timeline.

A template's content lives in immutable ``JobTemplateVersion`` rows: an edit appends a version,
and a job pins the version it was submitted from. Job state changes only through
``jobs.state.transition`` (row lock, legality check, event, audit, outbox — one transaction).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class JobTemplate(models.Model):
    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.PROTECT, related_name="+"
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="templates"
    )
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True, max_length=2000)
    latest_version = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="uniq_template_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.latest_version}"


class JobTemplateVersion(models.Model):
    template = models.ForeignKey(JobTemplate, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    spec = models.JSONField()
    allowed_overrides = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["template_id", "version"]
        constraints = [
            models.UniqueConstraint(fields=["template", "version"], name="uniq_template_version"),
        ]

    def __str__(self) -> str:
        return f"{self.template.name} v{self.version}"


class JobState(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"
    QUEUED = "queued"
    LAUNCHING = "launching"
    RUNNING = "running"
    # Preempted, within its grace period: its driver was sent SIGTERM and its cluster is torn
    # down once the driver exits or the grace passes; it still holds its reservation.
    PREEMPTING = "preempting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED}
)
# The states that hold a reservation.
ACTIVE_STATES = frozenset({JobState.LAUNCHING, JobState.RUNNING, JobState.PREEMPTING})


class Job(models.Model):
    # No index of their own: the composite indexes below start with each (a second one would
    # cost every insert and state change, and lets the planner read a workspace's queue
    # unordered and sort all of it to find its first job).
    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    # None for an ad-hoc job (submitted with a spec of its own, where the workspace allows it).
    template_version = models.ForeignKey(
        JobTemplateVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    name = models.CharField(max_length=100)
    state = models.CharField(max_length=20, choices=JobState.choices)
    spec = models.JSONField()  # the resolved spec: template version + overrides
    overrides = models.JSONField(default=dict, blank=True)
    # What quota admission counts: head + Σ replicas × node spec, or, on the local host's
    # sandboxes, Σ of what each node's sandbox allows (jobs.services.requested_for).
    requested_cpu = models.FloatField()
    requested_memory_gb = models.FloatField()
    requested_gpu = models.FloatField()
    # 0 for jobs from before disk counted (and those a previous release writes during a deploy).
    requested_disk_gb = models.FloatField(default=0, db_default=0)
    priority = models.PositiveSmallIntegerField()
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="submitted_jobs"
    )
    approval_required = models.BooleanField(default=False)
    approval_reason = models.CharField(max_length=300, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=1000, blank=True)
    failure_reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # the admission order, read in chunks: per organisation and per workspace
            models.Index(
                fields=["organization", "state", "-priority", "queued_at", "id"],
                name="job_org_queue_idx",
            ),
            models.Index(
                fields=["workspace", "state", "-priority", "queued_at", "id"],
                name="job_ws_queue_idx",
            ),
            # the organisation's recent submissions, newest first (jobs.prediction's arrivals)
            models.Index(fields=["organization", "-created_at"], name="job_org_created_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"

    @property
    def requested(self) -> dict[str, float]:
        return {
            "cpu": self.requested_cpu,
            "memory_gb": self.requested_memory_gb,
            "gpu": self.requested_gpu,
            "disk_gb": self.requested_disk_gb,
        }

    @property
    def max_runtime_seconds(self) -> int:
        """The spec's runtime limit; admission's queue scan reads it alone, as an annotation
        (``scanned_max_runtime``), instead of loading each queued job's spec."""
        if "scanned_max_runtime" in self.__dict__:
            return self.__dict__["scanned_max_runtime"] or 0
        return self.spec.get("max_runtime_seconds", 0)

    @property
    def gpu_flavors(self) -> tuple[str, ...]:
        """The GPU flavors the job accepts, in order (empty: any); admission's queue scan
        reads them alone, as an annotation (``scanned_gpu_flavor``)."""
        if "scanned_gpu_flavor" in self.__dict__:
            return tuple(self.__dict__["scanned_gpu_flavor"] or ())
        return tuple(self.spec.get("gpu_flavor") or ())

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class AttemptState(models.TextChoices):
    LAUNCHING = "launching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"


ATTEMPT_ACTIVE = frozenset({AttemptState.LAUNCHING, AttemptState.RUNNING})


class JobAttempt(models.Model):
    """One try of a job on one cluster. Its id is the Ray job's submission_id, so a repeated
    submit after a crash adopts the existing Ray job instead of running it twice."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.LAUNCHING
    )
    target_kind = models.CharField(max_length=16)
    target_name = models.CharField(max_length=64)
    cluster_name = models.CharField(max_length=63)
    # The GPU flavor admission chose for this attempt ("": untyped GPUs, or none).
    gpu_flavor = models.CharField(max_length=32, blank=True, default="", db_default="")
    dashboard_url = models.CharField(max_length=200, blank=True)
    # The launcher's handle (addresses, process groups, cluster token), encrypted at rest.
    handle_encrypted = models.TextField(blank=True)
    # What the cluster was confined to: for `local`, the sandbox's uid, namespaces and limits.
    isolation = models.JSONField(default=dict, blank=True)
    # For a job from a code source: the commit its ref resolved to (retries reuse it) and the
    # package (sha256) it was turned into.
    code_commit = models.CharField(max_length=64, blank=True)
    code_package = models.CharField(max_length=64, blank=True)
    submitted = models.BooleanField(default=False)
    ray_status = models.CharField(max_length=16, blank=True)
    ray_message = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.CharField(max_length=64, blank=True)
    # Manta's copy of the driver log: saved while the attempt runs and, in full, at its end.
    # It keeps the log's end (MANTA_LOG_ARCHIVE_BYTES of it, see jobs/log_archive.py);
    # log_start is how many bytes of the log came before it.
    log_archive = models.TextField(blank=True)
    log_start = models.PositiveBigIntegerField(default=0)
    log_saved_at = models.DateTimeField(null=True, blank=True)
    # Held while a worker launches or tears down the attempt (renewed while it works).
    lease_until = models.DateTimeField(null=True, blank=True)
    # Bumped by the sweep when it restarts following; a follow task with an older token stops.
    follow_token = models.PositiveIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # a follower is alive
    ray_seen_at = models.DateTimeField(null=True, blank=True)  # Ray last answered about it
    created_at = models.DateTimeField(auto_now_add=True)
    launch_started_at = models.DateTimeField(null=True, blank=True)  # a worker took it
    cluster_ready_at = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    running_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    torn_down_at = models.DateTimeField(null=True, blank=True)
    # Preemption: when the attempt was told to leave (its grace period starts), for which
    # queued job, how long a grace it has, when its driver was sent SIGTERM, and the GPU-seconds
    # it had run when it ended preempted (work lost to the preemption).
    preempting_at = models.DateTimeField(null=True, blank=True)
    preempted_for = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    grace_seconds = models.PositiveIntegerField(null=True, blank=True)
    sigterm_at = models.DateTimeField(null=True, blank=True)
    preempted_gpu_seconds = models.FloatField(default=0, db_default=0)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="uniq_attempt_number"),
        ]
        indexes = [models.Index(fields=["state", "heartbeat_at"], name="attempt_state_hb_idx")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number} ({self.state})"

    @property
    def submission_id(self) -> str:
        return str(self.id)


class JobEvent(models.Model):
    """One entry of a job's timeline: a transition, with who made it and why."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20)
    kind = models.CharField(max_length=32)  # submitted, approved, rejected, preempted, retry, …
    actor_label = models.CharField(max_length=254)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.CharField(max_length=1000, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state or '∅'} → {self.to_state} ({self.kind})"


class WarmPool(models.Model):
    """Warm clusters of one shape for one of an organisation's ``local`` or ``kuberay`` compute
    targets: an org admin says how many to keep started ahead of need (``size``; 0, the
    default, keeps none) and how long an unused one may idle before it is stopped
    (``jobs/pools.py``; a kuberay pool's clusters are RayClusters, ``jobs/pool_targets.py``)."""

    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.CASCADE, related_name="+"
    )
    target_name = models.CharField(max_length=64)  # a ComputeTarget's name, or "local"
    kind = models.CharField(max_length=16, default="local", db_default="local")  # the target's
    # kuberay: the namespace its RayClusters live in (a job's RayJob must be in the same one to
    # select one), and the GPU flavor whose nodes its GPU pods go to ("" for none).
    namespace = models.CharField(max_length=63, blank=True, default="", db_default="")
    gpu_flavor = models.CharField(max_length=32, blank=True, default="", db_default="")
    # The cluster's shape: image, head and worker groups (a job spec's node fields), and its
    # key (jobs.pools.shape_key): what a job must match, node for node, to take one.
    spec = models.JSONField()
    shape_key = models.CharField(max_length=64)
    size = models.PositiveIntegerField(default=0)
    idle_timeout_seconds = models.PositiveIntegerField(default=600)
    # What one of its clusters holds of the host (what a job of its shape reserves).
    cpu = models.FloatField(default=0)
    memory_gb = models.FloatField(default=0)
    gpu = models.FloatField(default=0)
    disk_gb = models.FloatField(default=0)
    hits = models.PositiveBigIntegerField(default=0)  # attempts that took a warm cluster
    misses = models.PositiveBigIntegerField(default=0)  # attempts of its shape that found none
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "target_name", "shape_key"], name="uniq_warm_pool_shape"
            ),
        ]

    def __str__(self) -> str:
        return f"warm pool {self.pk} of {self.target_name} ({self.size})"


class WarmClusterState(models.TextChoices):
    STARTING = "starting"  # a worker is bringing it up
    IDLE = "idle"  # up, waiting for an attempt
    CLAIMED = "claimed"  # handed to exactly one attempt, which tears it down
    RETIRING = "retiring"  # to be stopped: timed out, yielded to admitted work, pool shrunk
    STOPPED = "stopped"


# The states whose clusters hold part of the host that no reservation covers.
WARM_HOLDING = frozenset(
    {WarmClusterState.STARTING, WarmClusterState.IDLE, WarmClusterState.RETIRING}
)


class WarmCluster(models.Model):
    """One cluster of a warm pool, started in a fresh sandbox with a fresh token before any
    tenant is known. The row is the truth: the sweep reconciles it with the processes."""

    pool = models.ForeignKey(WarmPool, on_delete=models.PROTECT, related_name="clusters")
    state = models.CharField(
        max_length=16, choices=WarmClusterState.choices, default=WarmClusterState.STARTING
    )
    handle_encrypted = models.TextField(blank=True)  # holds the token: encrypted at rest
    cpu = models.FloatField(default=0)
    memory_gb = models.FloatField(default=0)
    gpu = models.FloatField(default=0)
    disk_gb = models.FloatField(default=0)
    # The worker process starting it (pid and start time on this host): a row left
    # ``starting`` by a process that is gone is reconciled by the sweep.
    starter_pid = models.PositiveIntegerField(null=True, blank=True)
    starter_start = models.BigIntegerField(null=True, blank=True)
    attempt = models.OneToOneField(
        JobAttempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="warm_cluster"
    )
    stop_reason = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["pool", "state"], name="warm_pool_state_idx")]

    def __str__(self) -> str:
        return f"warm cluster {self.pk} ({self.state})"

    @property
    def submission_id(self) -> str:
        """What its handle says until an attempt claims it (never a uuid, so the sweep's stray
        check leaves it to the pool's)."""
        return f"warm-{self.pk}"

"""Org capacity, the quota tree, workspace quotas and the reservations admission holds.

The quota tree: the organisation is its root (its capacity is its limit), quota groups of any
depth are its inner nodes (``QuotaGroup``: a division, a team), and each workspace's quota is a
leaf (``WorkspaceQuota.group``; None: directly under the organisation). The arithmetic over it is
``quotas/ledger.py``'s; what each field means is docs/scheduling.md's "Quota tree".

A missing limit (``None``) means "no limit of its own": a workspace without ``limit_gpu`` may use
up to the org's capacity, and an org without capacity rows admits everything.

``disk_gb`` is the writable storage of a job's nodes: on the local target each cluster writes only
to a disk image of that size, so it is held like CPU and memory. Rows from before it was a
resource hold 0 of it.
"""

from __future__ import annotations

from django.db import models

RESOURCES = ("cpu", "memory_gb", "gpu", "disk_gb")


class QueuePolicy(models.TextChoices):
    FIFO = "fifo"  # strict order; a head that does not fit blocks the rest
    ROUND_ROBIN = "round_robin"  # skip what does not fit, let later jobs backfill
    BALANCED = "balanced"  # round_robin, until a skipped job waited too long
    # lowest (dominant share of guarantee now + decayed past usage share) ÷ weight first
    FAIR_SHARE = "fair_share"
    # priority 7-9 in strict order, 1-6 backfilled until a job waited the aging time
    INTELLIGENT = "intelligent"


class OrgQuota(models.Model):
    organization = models.OneToOneField(
        "workspaces.Organization", on_delete=models.CASCADE, related_name="quota"
    )
    cpu = models.FloatField(null=True, blank=True)
    memory_gb = models.FloatField(null=True, blank=True)
    gpu = models.FloatField(null=True, blank=True)
    disk_gb = models.FloatField(null=True, blank=True)
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)
    policy = models.CharField(max_length=16, choices=QueuePolicy.choices, default=QueuePolicy.FIFO)
    balanced_max_wait_seconds = models.PositiveIntegerField(default=600)
    preemption = models.BooleanField(default=False)
    # Under fair_share with preemption: an overdue head kept out by the organisation's capacity
    # may also preempt workspaces above their fair allocation (jobs/preemption.py).
    fair_share_preemption = models.BooleanField(
        default=False,
        db_default=False,
        help_text="fair_share with preemption: a job that waited longer than "
        "balanced_max_wait_seconds and is kept out only by the capacity may also preempt jobs "
        "of workspaces above their fair allocation, when that brings the shares closer to fair",
    )
    # Capacity per GPU flavor, e.g. {"h100": 8, "a100": 16} (quotas/flavors.py); a flavor not
    # named has no cap of its own (``gpu`` still caps them all).
    gpu_flavors = models.JSONField(default=dict, db_default={}, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.organization_id}"

    def capacity(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in RESOURCES}


class BudgetAction(models.TextChoices):
    REFUSE = "refuse"
    QUEUE = "queue"


class QuotaGroup(models.Model):
    """An inner node of an organisation's quota tree (a division, a team): what its subtree is
    guaranteed, may hold at most, and lends to others."""

    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.CASCADE, related_name="quota_groups"
    )
    name = models.SlugField(max_length=64)
    # None: directly under the organisation. PROTECT: a group with subgroups is not deleted
    # (its children would silently move up the tree).
    parent = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="children"
    )
    guaranteed_cpu = models.FloatField(default=0)
    guaranteed_memory_gb = models.FloatField(default=0)
    guaranteed_gpu = models.FloatField(default=0)
    guaranteed_disk_gb = models.FloatField(default=0)
    limit_cpu = models.FloatField(null=True, blank=True)
    limit_memory_gb = models.FloatField(null=True, blank=True)
    limit_gpu = models.FloatField(null=True, blank=True)
    limit_disk_gb = models.FloatField(null=True, blank=True)
    # How much of its guarantee it lends to the rest of the tree while idle (None: all of it).
    lending_limit_cpu = models.FloatField(null=True, blank=True)
    lending_limit_memory_gb = models.FloatField(null=True, blank=True)
    lending_limit_gpu = models.FloatField(null=True, blank=True)
    lending_limit_disk_gb = models.FloatField(null=True, blank=True)
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)
    fair_share_weight = models.FloatField(default=1.0)
    # Guaranteed, limit and lending limit per GPU flavor, e.g. {"h100": {"guaranteed": 4,
    # "limit": 8, "lending_limit": 2}} (quotas/flavors.py); within the totals above.
    gpu_flavors = models.JSONField(default=dict, db_default={}, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name"], name="one_quota_group_name_per_org"
            )
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def guaranteed(self) -> dict[str, float]:
        return {name: getattr(self, f"guaranteed_{name}") for name in RESOURCES}

    def limit(self) -> dict[str, float | None]:
        return {name: getattr(self, f"limit_{name}") for name in RESOURCES}

    def lending_limit(self) -> dict[str, float | None]:
        return {name: getattr(self, f"lending_limit_{name}") for name in RESOURCES}


class WorkspaceQuota(models.Model):
    workspace = models.OneToOneField(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="quota"
    )
    guaranteed_cpu = models.FloatField(default=0)
    guaranteed_memory_gb = models.FloatField(default=0)
    guaranteed_gpu = models.FloatField(default=0)
    guaranteed_disk_gb = models.FloatField(default=0)
    limit_cpu = models.FloatField(null=True, blank=True)
    limit_memory_gb = models.FloatField(null=True, blank=True)
    limit_gpu = models.FloatField(null=True, blank=True)
    limit_disk_gb = models.FloatField(null=True, blank=True)
    # Its place in the quota tree: None, directly under the organisation.
    group = models.ForeignKey(
        QuotaGroup,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="workspace_quotas",
    )
    lending_limit_cpu = models.FloatField(null=True, blank=True)
    lending_limit_memory_gb = models.FloatField(null=True, blank=True)
    lending_limit_gpu = models.FloatField(null=True, blank=True)
    lending_limit_disk_gb = models.FloatField(null=True, blank=True)
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)
    max_queued_jobs = models.PositiveIntegerField(null=True, blank=True)
    gpu_hours_per_month = models.FloatField(null=True, blank=True)
    budget_action = models.CharField(
        max_length=8, choices=BudgetAction.choices, default=BudgetAction.REFUSE
    )
    # Under fair_share, the workspace's share (now and past) is divided by this: a weight of 2
    # lets it use twice as much as a workspace of weight 1 before it waits behind it.
    # db_default: a row written by a process of the previous release (during a deploy) weighs 1.
    fair_share_weight = models.FloatField(default=1.0, db_default=1.0)
    # Guaranteed, limit, lending limit and monthly GPU-hour budget per GPU flavor, e.g.
    # {"h100": {"guaranteed": 2, "limit": 4, "gpu_hours_per_month": 100}} (quotas/flavors.py);
    # within the totals above.
    gpu_flavors = models.JSONField(default=dict, db_default={}, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of workspace {self.workspace_id}"

    def guaranteed(self) -> dict[str, float]:
        return {name: getattr(self, f"guaranteed_{name}") for name in RESOURCES}

    def limit(self) -> dict[str, float | None]:
        return {name: getattr(self, f"limit_{name}") for name in RESOURCES}

    def lending_limit(self) -> dict[str, float | None]:
        return {name: getattr(self, f"lending_limit_{name}") for name in RESOURCES}


class Reservation(models.Model):
    """Resources held for one launching/running job; released exactly once when it leaves."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="reservations")
    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.CASCADE, related_name="+"
    )
    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="+"
    )
    cpu = models.FloatField()
    memory_gb = models.FloatField()
    gpu = models.FloatField()
    # db_default: a row written by a process of the previous release (during a deploy) holds 0.
    disk_gb = models.FloatField(default=0, db_default=0)
    # The shared host the job runs on ("local"), whose capacity binds every organisation.
    host = models.CharField(max_length=32, blank=True, default="")
    # The GPU flavor its GPUs are of ("": untyped, or no GPUs).
    gpu_flavor = models.CharField(max_length=32, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job"],
                condition=models.Q(released_at__isnull=True),
                name="one_active_reservation_per_job",
            )
        ]
        indexes = [
            models.Index(
                fields=["organization", "workspace"],
                condition=models.Q(released_at__isnull=True),
                name="active_resv_idx",
            )
        ]

    def __str__(self) -> str:
        return f"reservation of job {self.job_id}"


class FairShareUsage(models.Model):
    """A workspace's past use of its organisation's resources, for ``fair_share``: per resource,
    the amount × seconds its ended reservations held, decayed by half every
    ``MANTA_FAIR_SHARE_HALF_LIFE_HOURS`` up to ``as_of``. One row per workspace, written when a
    reservation is released and decayed lazily on read (``quotas.ledger.PastUsage``)."""

    workspace = models.OneToOneField(
        "workspaces.Workspace", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    organization = models.ForeignKey(
        "workspaces.Organization", on_delete=models.CASCADE, related_name="+"
    )
    cpu = models.FloatField(default=0)  # CPU-seconds
    memory_gb = models.FloatField(default=0)  # GB-seconds
    gpu = models.FloatField(default=0)  # GPU-seconds
    disk_gb = models.FloatField(default=0)  # GB-seconds
    as_of = models.DateTimeField()

    def __str__(self) -> str:
        return f"past usage of workspace {self.workspace_id}"


class BudgetAlert(models.Model):
    """A ``quota.threshold_reached`` event already sent for one budget period and threshold, of
    the workspace's total GPU budget (``gpu_flavor`` "") or of one flavor's."""

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="+"
    )
    gpu_flavor = models.CharField(max_length=32, blank=True, default="", db_default="")
    period = models.DateField()  # the first day of the month
    threshold = models.PositiveSmallIntegerField()  # percent: 80 or 100
    used_gpu_hours = models.FloatField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "gpu_flavor", "period", "threshold"],
                name="one_alert_per_flavor_threshold",
            ),
        ]

    def __str__(self) -> str:
        budget = f"GPU flavor {self.gpu_flavor} budget" if self.gpu_flavor else "GPU budget"
        return f"{self.threshold}% of the {budget} of {self.workspace_id} in {self.period}"


class AdmissionRequests(models.Model):
    """Single-flight admission: how many passes were asked for an organisation, and up to which
    request the last completed pass served. A trigger that finds a pass running only bumps
    ``requested``; the running pass sees it and goes round once more."""

    organization = models.OneToOneField(
        "workspaces.Organization", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    requested = models.BigIntegerField(default=0)
    served = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"admission of {self.organization_id}: {self.served}/{self.requested}"

"""One factory per model of our apps: valid, saved rows with consistent tenancy (a job's
organisation is its workspace's; whoever a row names as its author is a member there), made
without the API or the services, for tests whose subject is not how the rows came to be.

Rows with write rules of their own are made the way the code makes them: audit events (and so
chain heads) through ``audit.services.record``, since the table is append-only and hash-chained;
API tokens and invitations store the hash of a secret the factory knows and hands back on the
object (``token.secret``, ``invitation.token``); a workspace comes with its role groups and their
permissions, and a workspace role puts the user in its group, as the services keep them.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import secrets

import factory
from django.conf import settings
from django.utils import timezone
from factory.django import DjangoModelFactory

from audit import services as audit
from audit.chain import canonical_json
from audit.context import Actor
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent
from config import secrets as secrets_box
from jobs.api.examples import COUNTER_SPEC
from jobs.models import (
    AttemptState,
    Job,
    JobAttempt,
    JobEvent,
    JobState,
    JobTemplate,
    JobTemplateVersion,
    WarmCluster,
    WarmClusterState,
    WarmPool,
)
from jobs.services import requested_for
from jobs.spec import validate_spec
from notifications import signing
from notifications.models import (
    DeliveryState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookSecret,
)
from outbox.models import DomainEvent
from packages.models import CodePackage, CodeSource
from quotas.models import (
    AdmissionRequests,
    BudgetAlert,
    FairShareUsage,
    OrgQuota,
    QuotaGroup,
    Reservation,
    WorkspaceQuota,
)
from workspaces import invitations
from workspaces import services as ws_services
from workspaces.identity import TOKEN_PREFIX, sync_staff, token_hash
from workspaces.models import (
    ApiToken,
    ComputeTarget,
    ComputeTargetKind,
    IdempotencyRecord,
    Invitation,
    Organization,
    OrgMembership,
    OrgRole,
    User,
    Workspace,
    WorkspaceMembership,
    WorkspaceRole,
    WorkspaceRoleGroup,
)
from workspaces.services import DEFAULT_IMAGE_PREFIXES

PASSWORD = "correct-horse-battery-staple"
SYSTEM = Actor.system("tests")
TEMPLATE_OVERRIDES = ["entrypoint", "worker_groups", "priority", "max_runtime_seconds"]


def counter_spec(**changes) -> dict:
    """The counter job's spec as a client sends it, with ``changes``."""
    return {**copy.deepcopy(COUNTER_SPEC), **changes}


def resolved_spec(organization: Organization, **changes) -> dict:
    """The counter spec as the services store it: validated, with every default filled in."""
    return validate_spec(counter_spec(**changes), organization=organization)


class KeepsSecret:
    """For rows that store only a hash: the declaration ``_secret_attribute`` names is not a
    column; its value goes back on the object, to be used the way a client would."""

    _secret_attribute = "secret"

    @classmethod
    def _build(cls, model_class, *args, **kwargs):
        secret = kwargs.pop(cls._secret_attribute)
        instance = super()._build(model_class, *args, **kwargs)
        setattr(instance, cls._secret_attribute, secret)
        return instance

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        secret = kwargs.pop(cls._secret_attribute)
        instance = super()._create(model_class, *args, **kwargs)
        setattr(instance, cls._secret_attribute, secret)
        return instance


# --- workspaces ----------------------------------------------------------------------------------


class UserFactory(DjangoModelFactory):
    """A user; ``in_org=org`` (with ``in_org__role``) and ``in_workspace=ws`` (with
    ``in_workspace__role``, default developer) make them a member there."""

    class Meta:
        model = User
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"user{n}@example.test")
    full_name = factory.Faker("name")
    password = factory.django.Password(PASSWORD)

    @factory.post_generation
    def in_org(user, create, organization, role=OrgRole.MEMBER, **kwargs):
        if create and organization is not None:
            OrgMembershipFactory(organization=organization, user=user, role=role)

    @factory.post_generation
    def in_workspace(user, create, workspace, role=WorkspaceRole.DEVELOPER, **kwargs):
        if create and workspace is not None:
            WorkspaceMembershipFactory(workspace=workspace, user=user, role=role)


# A value handed to a post-generation hook is resolved one level further down than an attribute:
# in these, "..." is the row being made.


def member_of_its_workspace(role: str = WorkspaceRole.DEVELOPER):
    """A new user with ``role`` in the workspace of the row being made."""
    return factory.SubFactory(
        UserFactory, in_workspace=factory.SelfAttribute("...workspace"), in_workspace__role=role
    )


def admin_of_its_organization():
    """A new admin of the organisation of the row being made."""
    return factory.SubFactory(
        UserFactory, in_org=factory.SelfAttribute("...organization"), in_org__role=OrgRole.ADMIN
    )


class OrganizationFactory(DjangoModelFactory):
    class Meta:
        model = Organization

    slug = factory.Sequence(lambda n: f"org-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())
    allowed_image_prefixes = factory.LazyFunction(lambda: list(DEFAULT_IMAGE_PREFIXES))


class OrgMembershipFactory(DjangoModelFactory):
    class Meta:
        model = OrgMembership
        skip_postgeneration_save = True

    organization = factory.SubFactory(OrganizationFactory)
    user = factory.SubFactory(UserFactory)
    role = OrgRole.MEMBER

    @factory.post_generation
    def staff(membership, create, extracted, **kwargs):
        """Staff (the admin panel) follows "administers some org", as the services keep it."""
        if create:
            sync_staff(membership.user)


class InvitationFactory(KeepsSecret, DjangoModelFactory):
    """A pending invitation sent by an org admin; ``invitation.token`` accepts it."""

    class Meta:
        model = Invitation

    _secret_attribute = "token"

    organization = factory.SubFactory(OrganizationFactory)
    email = factory.Sequence(lambda n: f"invitee{n}@example.test")
    org_role = OrgRole.MEMBER
    token = factory.LazyFunction(lambda: invitations.TOKEN_PREFIX + secrets.token_urlsafe(32))
    token_hash = factory.LazyAttribute(lambda o: token_hash(o.token))
    invited_by = admin_of_its_organization()
    expires_at = factory.LazyFunction(
        lambda: timezone.now() + dt.timedelta(days=settings.MANTA_INVITATION_DAYS)
    )


class WorkspaceRoleGroupFactory(DjangoModelFactory):
    """One role's guardian group on a workspace, holding that role's permissions (made by the
    service that makes them for a new workspace)."""

    class Meta:
        model = WorkspaceRoleGroup

    workspace = factory.SubFactory("tests.factories.WorkspaceFactory", role_groups=False)
    role = WorkspaceRole.VIEWER

    @classmethod
    def _create(cls, model_class, workspace, role):
        return ws_services.role_group_create(workspace, role)


class WorkspaceFactory(DjangoModelFactory):
    """A workspace with its role groups (``role_groups=False``: without)."""

    class Meta:
        model = Workspace
        skip_postgeneration_save = True

    organization = factory.SubFactory(OrganizationFactory)
    slug = factory.Sequence(lambda n: f"ws-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.upper())

    @factory.post_generation
    def role_groups(workspace, create, extracted, **kwargs):
        if create and extracted is not False:
            ws_services.role_groups_create(workspace)


class WorkspaceMembershipFactory(DjangoModelFactory):
    """A workspace role: the user is (made) a member of the organisation and joins the role's
    group, which is what permission checks read."""

    class Meta:
        model = WorkspaceMembership
        skip_postgeneration_save = True

    workspace = factory.SubFactory(WorkspaceFactory)
    user = factory.SubFactory(UserFactory)
    role = WorkspaceRole.DEVELOPER

    @factory.post_generation
    def grant(membership, create, extracted, **kwargs):
        if not create:
            return
        workspace = membership.workspace
        OrgMembership.objects.get_or_create(
            organization_id=workspace.organization_id,
            user=membership.user,
            defaults={"role": OrgRole.MEMBER},
        )
        ws_services.role_group_join(membership)


class ApiTokenFactory(KeepsSecret, DjangoModelFactory):
    """A token; ``token.secret`` is what a client sends as ``Bearer``."""

    class Meta:
        model = ApiToken

    user = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"token-{n}")
    secret = factory.LazyFunction(lambda: TOKEN_PREFIX + secrets.token_urlsafe(32))
    prefix = factory.LazyAttribute(lambda o: o.secret[: len(TOKEN_PREFIX) + 6])
    key_hash = factory.LazyAttribute(lambda o: token_hash(o.secret))


class ComputeTargetFactory(DjangoModelFactory):
    class Meta:
        model = ComputeTarget

    organization = factory.SubFactory(OrganizationFactory)
    name = factory.Sequence(lambda n: f"target-{n}")
    kind = ComputeTargetKind.RAY
    config = factory.LazyFunction(lambda: {"address": "http://ray.example.com:8265"})


class IdempotencyRecordFactory(DjangoModelFactory):
    """The stored outcome of a create sent with an Idempotency-Key."""

    class Meta:
        model = IdempotencyRecord

    class Params:
        body = factory.LazyFunction(lambda: {"slug": "retry-me"})
        response = factory.LazyFunction(lambda: {"slug": "retry-me"})

    user = factory.SubFactory(UserFactory)
    key = factory.Sequence(lambda n: f"key-{n}")
    path = "/api/v1/orgs/acme/workspaces/"
    fingerprint = factory.LazyAttribute(
        lambda o: hashlib.sha256(canonical_json(o.body).encode()).hexdigest()
    )
    status_code = 201
    response_encrypted = factory.LazyAttribute(
        lambda o: secrets_box.encrypt(json.dumps(o.response))
    )


# --- audit ---------------------------------------------------------------------------------------


def _organization_of_workspace_or_new():
    return factory.Maybe(
        "workspace",
        yes_declaration=factory.SelfAttribute("workspace.organization"),
        no_declaration=factory.SubFactory(OrganizationFactory),
    )


class AuditEventFactory(factory.Factory):
    """An event appended to its organisation's chain by ``audit.services.record`` (the table
    takes no other writes). Only ``create()``: an event that is not appended has no hash."""

    class Meta:
        model = AuditEvent

    actor = SYSTEM
    action = "org.update"
    workspace = None
    organization = _organization_of_workspace_or_new()
    target = factory.SelfAttribute("organization")
    changes = factory.LazyFunction(lambda: {"name": ["Before", "After"]})
    metadata = factory.LazyFunction(dict)

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        return audit.record(**kwargs)

    @classmethod
    def _build(cls, model_class, *args, **kwargs):
        raise TypeError("audit events are only appended (audit.services.record): use create()")


class AuditChainHeadFactory(factory.Factory):
    """A chain's head exists once an event is appended to it: made by appending one."""

    class Meta:
        model = AuditChainHead

    event = factory.SubFactory(AuditEventFactory)

    @classmethod
    def _create(cls, model_class, event):
        return model_class.objects.get(chain=event.chain)

    @classmethod
    def _build(cls, model_class, *args, **kwargs):
        raise TypeError("a chain head follows its events: use create()")


class AuditCheckpointFactory(factory.Factory):
    """A checkpoint signs a verified head (``audit.services.checkpoint_create``): made by
    appending one event and checkpointing its chain."""

    class Meta:
        model = AuditCheckpoint

    event = factory.SubFactory(AuditEventFactory)

    @classmethod
    def _create(cls, model_class, event):
        return audit.checkpoint_create(chain=event.chain)

    @classmethod
    def _build(cls, model_class, *args, **kwargs):
        raise TypeError("a checkpoint signs a verified chain: use create()")


# --- outbox --------------------------------------------------------------------------------------


class DomainEventFactory(DjangoModelFactory):
    """A not yet dispatched ``workspace.created`` (the dispatcher fans it out when it runs)."""

    class Meta:
        model = DomainEvent

    type = "workspace.created"
    workspace = factory.SubFactory(WorkspaceFactory)
    organization = _organization_of_workspace_or_new()
    payload = factory.LazyAttribute(
        lambda o: {
            "name": getattr(o.workspace, "name", ""),
            "description": "",
            "actor": SYSTEM.label,
        }
    )


# --- notifications -------------------------------------------------------------------------------


class WebhookEndpointFactory(DjangoModelFactory):
    """A workspace's endpoint (``workspace=None, organization=org``: an org-level one), created
    by an org admin, with a signing secret."""

    class Meta:
        model = WebhookEndpoint
        skip_postgeneration_save = True

    workspace = factory.SubFactory(WorkspaceFactory)
    organization = _organization_of_workspace_or_new()
    url = factory.Sequence(lambda n: f"https://hooks.example.com/{n}")
    event_types = factory.LazyFunction(lambda: [WebhookEndpoint.ALL])
    created_by = admin_of_its_organization()
    secret = factory.RelatedFactory(
        "tests.factories.WebhookSecretFactory", factory_related_name="endpoint"
    )


class WebhookSecretFactory(DjangoModelFactory):
    class Meta:
        model = WebhookSecret

    class Params:
        secret = factory.LazyFunction(signing.secret_generate)

    endpoint = factory.SubFactory(WebhookEndpointFactory, secret=None)
    secret_encrypted = factory.LazyAttribute(lambda o: secrets_box.encrypt(o.secret))


class WebhookDeliveryFactory(DjangoModelFactory):
    """A delivery of a domain event, just fanned out (due now). Traits: ``of_audit_event`` (the
    ``audit.event`` stream) and ``ping``."""

    class Meta:
        model = WebhookDelivery

    class Params:
        of_audit_event = factory.Trait(
            event=None,
            audit_event=factory.SubFactory(
                AuditEventFactory,
                organization=factory.SelfAttribute("..endpoint.organization"),
                workspace=factory.SelfAttribute("..endpoint.workspace"),
            ),
            event_type="audit.event",
            occurred_at=factory.SelfAttribute("audit_event.occurred_at"),
            message_id=factory.LazyAttribute(lambda o: f"msg_audit_{o.audit_event.pk}"),
        )
        ping = factory.Trait(
            event=None,
            event_type="webhook.ping",
            occurred_at=factory.LazyFunction(timezone.now),
            message_id=factory.LazyFunction(lambda: f"msg_{secrets.token_hex(16)}"),
            data=factory.LazyAttribute(
                lambda o: {"webhook": o.endpoint.pk, "message": f"ping from {SYSTEM.label}"}
            ),
        )

    endpoint = factory.SubFactory(WebhookEndpointFactory)
    event = factory.SubFactory(
        DomainEventFactory,
        organization=factory.SelfAttribute("..endpoint.organization"),
        workspace=factory.SelfAttribute("..endpoint.workspace"),
    )
    event_type = factory.SelfAttribute("event.type")
    occurred_at = factory.SelfAttribute("event.occurred_at")
    message_id = factory.LazyAttribute(lambda o: f"msg_{o.event.pk.hex}")
    state = DeliveryState.PENDING
    next_attempt_at = factory.LazyFunction(timezone.now)


class WebhookAttemptFactory(DjangoModelFactory):
    """A successful HTTP attempt of a delivery."""

    class Meta:
        model = WebhookAttempt

    delivery = factory.SubFactory(WebhookDeliveryFactory)
    started_at = factory.LazyFunction(timezone.now)
    duration_ms = 12
    status_code = 200
    response_excerpt = "ok"


# --- packages ------------------------------------------------------------------------------------


class CodePackageFactory(DjangoModelFactory):
    """A package row (its bytes are not stored: write them where the test needs them)."""

    class Meta:
        model = CodePackage

    workspace = factory.SubFactory(WorkspaceFactory)
    sha256 = factory.Sequence(lambda n: hashlib.sha256(f"package-{n}".encode()).hexdigest())
    size = 1024
    uploaded_by = member_of_its_workspace()


class CodeSourceFactory(DjangoModelFactory):
    class Meta:
        model = CodeSource

    workspace = factory.SubFactory(WorkspaceFactory)
    name = factory.Sequence(lambda n: f"source-{n}")
    url = factory.LazyAttribute(lambda o: f"https://git.example.com/{o.name}.git")
    created_by = member_of_its_workspace(WorkspaceRole.ADMIN)


# --- jobs ----------------------------------------------------------------------------------------


class JobTemplateFactory(DjangoModelFactory):
    """The counter template, published by a workspace admin, with its first version (set it
    with ``version__spec_changes``, ``version__allowed_overrides``)."""

    class Meta:
        model = JobTemplate
        skip_postgeneration_save = True

    workspace = factory.SubFactory(WorkspaceFactory)
    organization = factory.SelfAttribute("workspace.organization")
    name = factory.Sequence(lambda n: f"template-{n}")
    created_by = member_of_its_workspace(WorkspaceRole.ADMIN)
    latest_version = 0  # the version below makes it 1
    version = factory.RelatedFactory(
        "tests.factories.JobTemplateVersionFactory", factory_related_name="template"
    )


class JobTemplateVersionFactory(DjangoModelFactory):
    """The template's next version (the counter spec with ``spec_changes``); the template then
    points at it, as template_update does."""

    class Meta:
        model = JobTemplateVersion
        skip_postgeneration_save = True

    class Params:
        spec_changes = factory.LazyFunction(dict)

    template = factory.SubFactory(JobTemplateFactory, version=None)
    version = factory.LazyAttribute(lambda o: o.template.latest_version + 1)
    spec = factory.LazyAttribute(lambda o: resolved_spec(o.template.organization, **o.spec_changes))
    allowed_overrides = factory.LazyFunction(lambda: list(TEMPLATE_OVERRIDES))
    created_by = factory.SelfAttribute("template.created_by")

    @factory.post_generation
    def latest(version, create, extracted, **kwargs):
        template = version.template
        if create and template.latest_version < version.version:
            template.latest_version = version.version
            template.save(update_fields=["latest_version", "updated_at"])


def _requested(resource: str):
    return factory.LazyAttribute(lambda o: o.requested[resource])


class JobFactory(DjangoModelFactory):
    """A queued job from a template's version, submitted by a developer of its workspace
    (``adhoc=True``: from a spec of its own). Its requests and priority follow its spec."""

    class Meta:
        model = Job

    class Params:
        adhoc = factory.Trait(template_version=None)
        # What the submission would reserve: on the local host's sandboxes, what they allow.
        requested = factory.LazyAttribute(lambda o: requested_for(o.workspace, o.spec)[0])

    workspace = factory.SubFactory(WorkspaceFactory)
    organization = factory.SelfAttribute("workspace.organization")
    template_version = factory.SubFactory(
        JobTemplateVersionFactory, template__workspace=factory.SelfAttribute("...workspace")
    )
    name = factory.LazyAttribute(
        lambda o: o.template_version.template.name if o.template_version else "adhoc"
    )
    state = JobState.QUEUED
    spec = factory.LazyAttribute(
        lambda o: (
            o.template_version.spec
            if o.template_version
            else resolved_spec(o.workspace.organization)
        )
    )
    requested_cpu = _requested("cpu")
    requested_memory_gb = _requested("memory_gb")
    requested_gpu = _requested("gpu")
    requested_disk_gb = _requested("disk_gb")
    priority = factory.LazyAttribute(lambda o: o.spec["priority"])
    submitted_by = member_of_its_workspace()
    approval_required = factory.LazyAttribute(lambda o: o.state == JobState.PENDING_APPROVAL)
    approval_reason = factory.LazyAttribute(
        lambda o: "the workspace requires approval for every job" if o.approval_required else ""
    )
    queued_at = factory.LazyAttribute(lambda o: None if o.approval_required else timezone.now())


class JobAttemptFactory(DjangoModelFactory):
    """The next attempt of a running job, on the local target."""

    class Meta:
        model = JobAttempt

    job = factory.SubFactory(JobFactory, state=JobState.RUNNING)
    number = factory.LazyAttribute(lambda o: o.job.attempts.count() + 1)
    state = AttemptState.RUNNING
    target_kind = ComputeTargetKind.LOCAL
    target_name = "local"
    cluster_name = factory.LazyAttribute(lambda o: f"manta-{o.job.pk}-{o.number}")


WARM_SHAPE = {
    "image": "rayproject/ray:2.60.0",
    "head": {"cpu": 0, "memory_gb": 1},
    "worker_groups": [{"name": "workers", "replicas": 1, "cpu": 1, "memory_gb": 1}],
}


class WarmPoolFactory(DjangoModelFactory):
    """A pool of the counter example's shape on the built-in local target, made by the service
    (its shape validated, its key and footprint computed), sized 0 unless ``size`` says."""

    class Meta:
        model = WarmPool

    organization = factory.SubFactory(OrganizationFactory)
    size = 0

    @classmethod
    def _create(cls, model_class, *args, organization, size=0, **kwargs):
        from jobs import pools

        spec = kwargs.pop("spec", WARM_SHAPE)
        pool = pools.pool_create(
            actor=SYSTEM, organization=organization, target_name="local", spec=spec, size=0
        )
        if size:  # set directly: a factory starts nothing
            WarmPool.objects.filter(pk=pool.pk).update(size=size)
            pool.size = size
        return pool


class WarmClusterFactory(DjangoModelFactory):
    """An idle warm cluster row of a pool (no processes behind it: its handle is empty)."""

    class Meta:
        model = WarmCluster

    pool = factory.SubFactory(WarmPoolFactory)
    state = WarmClusterState.IDLE
    ready_at = factory.LazyFunction(timezone.now)
    cpu = factory.SelfAttribute("pool.cpu")
    memory_gb = factory.SelfAttribute("pool.memory_gb")
    gpu = factory.SelfAttribute("pool.gpu")
    disk_gb = factory.SelfAttribute("pool.disk_gb")


class JobEventFactory(DjangoModelFactory):
    """The job's submission, in its timeline."""

    class Meta:
        model = JobEvent

    job = factory.SubFactory(JobFactory)
    from_state = ""
    to_state = factory.SelfAttribute("job.state")
    kind = "submitted"
    actor = factory.SelfAttribute("job.submitted_by")
    actor_label = factory.LazyAttribute(lambda o: o.actor.email)


# --- quotas --------------------------------------------------------------------------------------


class OrgQuotaFactory(DjangoModelFactory):
    class Meta:
        model = OrgQuota

    organization = factory.SubFactory(OrganizationFactory)
    cpu = 64.0
    memory_gb = 256.0
    gpu = 8.0


class QuotaGroupFactory(DjangoModelFactory):
    """A quota group directly under its organisation, with no quota of its own."""

    class Meta:
        model = QuotaGroup
        django_get_or_create = ("organization", "name")

    organization = factory.SubFactory(OrganizationFactory)
    name = factory.Sequence(lambda n: f"group-{n}")


class WorkspaceQuotaFactory(DjangoModelFactory):
    class Meta:
        model = WorkspaceQuota

    workspace = factory.SubFactory(WorkspaceFactory)


class FairShareUsageFactory(DjangoModelFactory):
    """A workspace's decayed past usage for fair share: an hour of one GPU, as of now."""

    class Meta:
        model = FairShareUsage

    workspace = factory.SubFactory(WorkspaceFactory)
    organization = factory.LazyAttribute(lambda usage: usage.workspace.organization)
    gpu = 3600.0
    as_of = factory.LazyFunction(timezone.now)


class ReservationFactory(DjangoModelFactory):
    """What admission holds for a running job: exactly what it requested."""

    class Meta:
        model = Reservation

    job = factory.SubFactory(JobFactory, state=JobState.RUNNING)
    organization = factory.SelfAttribute("job.organization")
    workspace = factory.SelfAttribute("job.workspace")
    cpu = factory.SelfAttribute("job.requested_cpu")
    memory_gb = factory.SelfAttribute("job.requested_memory_gb")
    gpu = factory.SelfAttribute("job.requested_gpu")
    disk_gb = factory.SelfAttribute("job.requested_disk_gb")


class BudgetAlertFactory(DjangoModelFactory):
    class Meta:
        model = BudgetAlert

    workspace = factory.SubFactory(WorkspaceFactory)
    period = factory.LazyFunction(lambda: timezone.now().date().replace(day=1))
    threshold = 80
    used_gpu_hours = 80.0


class AdmissionRequestsFactory(DjangoModelFactory):
    class Meta:
        model = AdmissionRequests

    organization = factory.SubFactory(OrganizationFactory)

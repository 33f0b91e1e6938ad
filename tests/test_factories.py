"""Every model of our apps has a factory, and every factory makes a valid saved row whose
tenancy is consistent: one organisation behind everything it refers to, and every user it names
a member there. Rows the services make a particular way are made that way."""

from __future__ import annotations

import inspect

import factory
import pytest
from django.apps import apps
from django.db import models

from audit.chain import verify_chain
from tests import factories as f
from workspaces import identity, invitations, selectors, services
from workspaces.models import Organization, OrgMembership, User, Workspace
from workspaces.roles import WORKSPACE_ROLE_PERMISSIONS

OUR_APPS = ("workspaces", "audit", "outbox", "notifications", "packages", "quotas", "jobs")

FACTORIES = sorted(
    (
        member
        for _, member in inspect.getmembers(f, inspect.isclass)
        if issubclass(member, factory.base.BaseFactory)
        and member.__module__ == f.__name__
        and member._meta.model is not None
    ),
    key=lambda cls: cls.__name__,
)


def our_models() -> list[type[models.Model]]:
    return [model for app in OUR_APPS for model in apps.get_app_config(app).get_models()]


def test_every_model_of_our_apps_has_a_factory():
    covered = {cls._meta.model for cls in FACTORIES}
    missing = sorted(model._meta.label for model in our_models() if model not in covered)
    assert not missing, f"models without a factory in tests/factories.py: {missing}"


def tenancy(row: models.Model, seen: set | None = None) -> tuple[set[int], set[int]]:
    """The organisations ``row`` belongs to, following every relation to our models, and the
    users it names."""
    seen = set() if seen is None else seen
    if (type(row), row.pk) in seen:
        return set(), set()
    seen.add((type(row), row.pk))
    orgs: set[int] = set()
    users: set[int] = set()
    if isinstance(row, Organization):
        orgs.add(row.pk)
    for field in row._meta.concrete_fields:
        if not field.is_relation:
            continue
        target = getattr(row, field.name)
        if target is None:
            continue
        if isinstance(target, User):
            users.add(target.pk)
        elif target._meta.app_label in OUR_APPS:
            more_orgs, more_users = tenancy(target, seen)
            orgs |= more_orgs
            users |= more_users
    return orgs, users


@pytest.mark.parametrize("factory_class", FACTORIES, ids=lambda cls: cls.__name__)
def test_a_factory_makes_a_valid_saved_row_with_consistent_tenancy(db, factory_class):
    row = factory_class()
    assert row.pk is not None
    row.refresh_from_db()
    row.full_clean()
    orgs, users = tenancy(row)
    assert len(orgs) <= 1, f"{row!r} refers to several organisations: {orgs}"
    if orgs and not isinstance(row, OrgMembership):
        strangers = users - set(
            OrgMembership.objects.filter(organization_id__in=orgs).values_list("user_id", flat=True)
        )
        assert not strangers, f"{row!r} names users outside its organisation: {strangers}"


def test_a_workspace_from_the_factory_has_the_role_groups_the_service_gives(db):
    def grants(workspace: Workspace) -> dict[str, set[str]]:
        return {
            role_group.role: set(
                role_group.group.groupobjectpermission_set.filter(
                    object_pk=str(workspace.pk)
                ).values_list("permission__codename", flat=True)
            )
            for role_group in workspace.role_groups.select_related("group")
        }

    made = f.WorkspaceFactory()
    created = services.workspace_create(actor=f.SYSTEM, organization=made.organization, slug="svc")
    assert grants(made) == grants(created)
    assert set(grants(made)) == set(WORKSPACE_ROLE_PERMISSIONS)


@pytest.mark.parametrize("role", list(WORKSPACE_ROLE_PERMISSIONS))
def test_a_workspace_role_from_the_factory_grants_that_role(db, role):
    membership = f.WorkspaceMembershipFactory(role=role)
    org_membership = OrgMembership.objects.get(
        user=membership.user, organization=membership.workspace.organization
    )
    held = selectors.workspace_permissions(membership.user, membership.workspace, org_membership)
    assert held == WORKSPACE_ROLE_PERMISSIONS[role]


def test_an_org_admin_from_the_factory_is_staff_and_a_member_is_not(db):
    assert f.OrgMembershipFactory(role="admin").user.is_staff
    assert not f.OrgMembershipFactory(role="member").user.is_staff


def test_the_secret_of_a_factory_token_authenticates(db):
    token = f.ApiTokenFactory()
    assert identity.token_authenticate(token.secret) == token


def test_the_token_of_a_factory_invitation_accepts_it(db):
    invitation = f.InvitationFactory(org_role="admin")
    membership = invitations.invitation_accept(token=invitation.token, password=f.PASSWORD)
    assert membership.organization == invitation.organization
    assert membership.user.email == invitation.email and membership.role == "admin"


def test_factory_users_sign_in_with_the_test_password(db):
    user = f.UserFactory()
    assert user.check_password(f.PASSWORD)


def test_audit_events_from_the_factory_extend_a_verifiable_chain(db):
    first = f.AuditEventFactory()
    second = f.AuditEventFactory(organization=first.organization, action="org.update")
    assert (second.seq, second.prev_hash) == (first.seq + 1, first.hash)
    assert verify_chain(first.chain).ok
    with pytest.raises(TypeError):
        f.AuditEventFactory.build()


def test_a_job_belongs_to_its_workspace_and_its_template_is_there_too(db):
    workspace = f.WorkspaceFactory()
    job = f.JobFactory(workspace=workspace)
    assert job.organization == workspace.organization
    assert job.template_version.template.workspace == workspace
    assert job.template_version.template.latest_version == job.template_version.version == 1
    # what the submission would reserve on the local host's sandboxes: the counter's 0-CPU head
    # gets 1, each node its memory + 30 % object store + 1 GiB of Ray's own, 10 GB of disk
    assert job.requested == pytest.approx(
        {"cpu": 2.0, "memory_gb": (2 + 0.6 + 1) + (1 + 0.3 + 1), "gpu": 0.0, "disk_gb": 20.0}
    )
    assert job.submitted_by.workspace_memberships.get().workspace == workspace
    adhoc = f.JobFactory(workspace=workspace, adhoc=True)
    assert adhoc.template_version is None and adhoc.spec == job.spec


def test_a_second_version_becomes_the_latest(db):
    template = f.JobTemplateFactory()
    second = f.JobTemplateVersionFactory(template=template)
    template.refresh_from_db()
    assert second.version == template.latest_version == 2

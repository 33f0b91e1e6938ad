"""model_update: set only the named fields, save and record only what changed, and leave the row
and the log alone when validation says no."""

import pytest

from audit.models import AuditEvent
from audit.services import model_update
from config.errors import InvalidInput
from tests.conftest import SYSTEM
from workspaces.models import ComputeTarget, Organization

ORG_FIELDS = ["name", "max_nodes_per_job"]


def update_org(org, data, **kwargs):
    return model_update(
        instance=org,
        fields=ORG_FIELDS,
        data=data,
        actor=SYSTEM,
        action="org.update",
        organization=org,
        **kwargs,
    )


def org_updates(org):
    return AuditEvent.objects.filter(action="org.update", target_id=str(org.pk))


def test_the_changes_are_saved_and_recorded(world):
    org = Organization.objects.get(pk=world.org.pk)
    changes = update_org(org, {"name": "Acme Corp", "max_nodes_per_job": 16})
    assert changes == {"name": ["Acme", "Acme Corp"]}  # 16 is the value it already had
    assert Organization.objects.get(pk=org.pk).name == "Acme Corp"
    (event,) = org_updates(org)
    assert event.changes == {"name": ["Acme", "Acme Corp"]}
    assert event.organization_id == org.pk and event.target_repr == "acme"


def test_nothing_is_saved_or_recorded_without_a_change(world, django_assert_num_queries):
    org = Organization.objects.get(pk=world.org.pk)
    with django_assert_num_queries(0):
        assert update_org(org, {"name": "Acme"}) == {}
    assert not org_updates(org).exists()


def test_a_field_not_named_is_never_set(world):
    org = Organization.objects.get(pk=world.org.pk)
    changes = update_org(org, {"name": "Renamed", "slug": "hijacked"})
    assert changes == {"name": ["Acme", "Renamed"]}
    assert org.slug == "acme"
    assert Organization.objects.get(pk=org.pk).slug == "acme"


def test_a_model_validation_error_names_the_field_and_saves_nothing(world):
    org = Organization.objects.get(pk=world.org.pk)
    with pytest.raises(InvalidInput) as raised:
        update_org(org, {"name": "Renamed", "max_nodes_per_job": 0})
    assert list(raised.value.errors) == ["max_nodes_per_job"]
    stored = Organization.objects.get(pk=org.pk)
    assert (stored.name, stored.max_nodes_per_job) == ("Acme", 16)
    assert not org_updates(org).exists()


def test_validate_sees_the_changes_runs_without_any_and_can_refuse(world):
    org = Organization.objects.get(pk=world.org.pk)
    seen = []
    update_org(org, {"name": "Acme"}, validate=seen.append)
    assert seen == [{}]

    def refuse(changes):
        seen.append(changes)
        raise InvalidInput.on("name", "not this one")

    with pytest.raises(InvalidInput):
        update_org(org, {"name": "Refused"}, validate=refuse)
    assert seen[-1] == {"name": ["Acme", "Refused"]}
    assert Organization.objects.get(pk=org.pk).name == "Acme"
    assert not org_updates(org).exists()


def test_bookkeeping_and_timestamps_are_saved_with_a_change_but_not_recorded(world):
    target = ComputeTarget.objects.create(
        organization=world.org, name="lab", kind="ray", config={"address": "a"}
    )
    stamped = target.updated_at
    untouched = model_update(
        instance=target,
        fields=["config"],
        data={"config": {"address": "a"}},
        actor=SYSTEM,
        action="compute_target.update",
        also={"secret_encrypted": "never written"},
    )
    assert untouched == {} and target.secret_encrypted == ""
    changes = model_update(
        instance=target,
        fields=["config"],
        data={"config": {"address": "b"}},
        actor=SYSTEM,
        action="compute_target.update",
        full_clean=False,
        also={"secret_encrypted": "sealed"},
        organization=world.org,
    )
    assert changes == {"config": [{"address": "a"}, {"address": "b"}]}
    stored = ComputeTarget.objects.get(pk=target.pk)
    assert stored.config == {"address": "b"} and stored.secret_encrypted == "sealed"
    assert stored.updated_at > stamped
    event = AuditEvent.objects.get(action="compute_target.update", target_id=str(target.pk))
    assert event.changes == changes

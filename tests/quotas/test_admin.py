"""Quotas in the admin panel: an org admin sees and edits only their organisations' capacity and
workspace quotas, each change goes through the quota service (checked and audited), and a change
the service refuses is shown as an error naming the field and changes nothing."""

import pytest
from django.test import Client

from audit.models import AuditEvent
from quotas import services
from quotas.models import OrgQuota, QuotaGroup, WorkspaceQuota
from tests.admin_forms import login, messages_of, submit
from tests.conftest import SYSTEM
from tests.factories import ReservationFactory, WorkspaceFactory

ORG_QUOTAS = "/admin/quotas/orgquota/"
WS_QUOTAS = "/admin/quotas/workspacequota/"


@pytest.fixture
def quotas(world):
    """Acme: 8 GPUs, ml guaranteed 2 of them (limit 4); Globex has quotas of its own."""
    acme = services.org_quota_update(
        actor=SYSTEM, organization=world.org, data={"cpu": 64, "gpu": 8}
    )
    ml = services.workspace_quota_update(
        actor=SYSTEM, workspace=world.ws, data={"guaranteed_gpu": 2, "limit_gpu": 4}
    )
    globex_ws = WorkspaceFactory(organization=world.other_org, slug="lab")
    globex = services.org_quota_update(actor=SYSTEM, organization=world.other_org, data={"gpu": 1})
    lab = services.workspace_quota_update(actor=SYSTEM, workspace=globex_ws, data={"limit_gpu": 1})
    return {"acme": acme, "ml": ml, "globex": globex, "lab": lab}


def test_each_org_admin_sees_only_their_quotas(world, quotas):
    admin = login("admin@acme.test")
    listing = admin.get(WS_QUOTAS).content.decode()
    assert f"{WS_QUOTAS}{quotas['ml'].pk}/change/" in listing
    assert f"{WS_QUOTAS}{quotas['lab'].pk}/change/" not in listing
    assert "2 / 4" in listing  # ml's GPUs: guaranteed / limit
    orgs = admin.get(ORG_QUOTAS).content.decode()
    assert f"{ORG_QUOTAS}{quotas['acme'].pk}/change/" in orgs
    assert f"{ORG_QUOTAS}{quotas['globex'].pk}/change/" not in orgs
    for url in (f"{WS_QUOTAS}{quotas['lab'].pk}/change/", f"{ORG_QUOTAS}{quotas['globex'].pk}/"):
        assert admin.get(url, follow=True).redirect_chain[-1][0] == "/admin/"  # "does not exist"
    assert login("owner@globex.test").get(f"{WS_QUOTAS}{quotas['ml'].pk}/change/").status_code in (
        302,
        404,
    )


@pytest.mark.parametrize("who", ["dev@acme.test", "wsadmin@acme.test", "member@acme.test"])
def test_members_who_do_not_administer_the_org_are_refused(world, quotas, who):
    client = login(who)
    for url in (WS_QUOTAS, f"{WS_QUOTAS}{quotas['ml'].pk}/change/", ORG_QUOTAS):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert Client().get(WS_QUOTAS).status_code == 302


def test_the_page_shows_what_jobs_hold_now(world, quotas):
    ReservationFactory(job__workspace=world.ws, cpu=3, memory_gb=4, gpu=1)
    page = login("admin@acme.test").get(f"{WS_QUOTAS}{quotas['ml'].pk}/change/").content.decode()
    assert "gpu 1 of 4" in page and "cpu 3 of unlimited" in page


def test_a_workspace_quota_change_goes_through_the_service_and_is_audited(world, quotas):
    admin = login("admin@acme.test")
    url = f"{WS_QUOTAS}{quotas['ml'].pk}/change/"
    response = submit(admin, url, guaranteed_gpu="3", limit_gpu="6", gpu_hours_per_month="100")
    assert response.status_code == 302, response.content.decode()[:3000]
    quota = WorkspaceQuota.objects.get(pk=quotas["ml"].pk)
    assert (quota.guaranteed_gpu, quota.limit_gpu, quota.gpu_hours_per_month) == (3, 6, 100)
    event = AuditEvent.objects.filter(action="quota.update").latest("id")
    assert event.actor_id == world.users["org_admin"].pk and event.workspace_id == world.ws.pk
    assert event.changes == {
        "guaranteed_gpu": [2.0, 3.0],
        "limit_gpu": [4.0, 6.0],
        "gpu_hours_per_month": [None, 100.0],
    }


def test_a_change_the_service_refuses_is_an_error_and_changes_nothing(world, quotas):
    admin = login("admin@acme.test")
    url = f"{WS_QUOTAS}{quotas['ml'].pk}/change/"
    events = AuditEvent.objects.count()
    response = submit(admin, url, limit_gpu="99")  # the organisation has 8
    assert response.status_code == 302 and response["Location"] == url
    shown = messages_of(admin.get(url))
    assert any("limit_gpu" in m and "above the organisation's capacity 8" in m for m in shown)
    assert not any("successfully" in m for m in shown)
    assert WorkspaceQuota.objects.get(pk=quotas["ml"].pk).limit_gpu == 4
    assert AuditEvent.objects.count() == events

    negative = submit(admin, url, guaranteed_cpu="-1")
    assert negative.status_code == 200  # the form again, with the rule beside the field
    assert "greater than or equal to 0" in negative.content.decode()
    assert WorkspaceQuota.objects.get(pk=quotas["ml"].pk).guaranteed_cpu == 0


def test_org_capacity_below_the_guarantees_is_refused(world, quotas):
    admin = login("owner@acme.test")
    url = f"{ORG_QUOTAS}{quotas['acme'].pk}/change/"
    response = submit(admin, url, gpu="1")  # ml is guaranteed 2
    assert response.status_code == 302
    assert any("capacity 1" in m for m in messages_of(admin.get(url)))
    assert OrgQuota.objects.get(pk=quotas["acme"].pk).gpu == 8
    assert submit(admin, url, gpu="16", policy="fair_share").status_code == 302
    quota = OrgQuota.objects.get(pk=quotas["acme"].pk)
    assert (quota.gpu, quota.policy) == (16, "fair_share")
    event = AuditEvent.objects.filter(action="quota.update").latest("id")
    assert event.actor_id == world.users["owner"].pk and event.organization_id == world.org.pk


def test_adding_a_workspace_quota_offers_only_own_workspaces(world):
    admin = login("admin@acme.test")
    lab = WorkspaceFactory(organization=world.other_org, slug="lab")
    page = admin.get(f"{WS_QUOTAS}add/").content.decode()
    assert f'<option value="{world.ws.pk}">' in page
    assert f'<option value="{lab.pk}">' not in page
    form = {"limit_cpu": "8", "budget_action": "refuse",
            **{f"guaranteed_{r}": "0" for r in ("cpu", "memory_gb", "gpu", "disk_gb")}}  # fmt: skip
    foreign = admin.post(f"{WS_QUOTAS}add/", {**form, "workspace": lab.pk})
    assert foreign.status_code == 200 and "Select a valid choice" in foreign.content.decode()
    assert not WorkspaceQuota.objects.filter(workspace=lab).exists()
    response = admin.post(f"{WS_QUOTAS}add/", {**form, "workspace": world.ws.pk})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert WorkspaceQuota.objects.get(workspace=world.ws).limit_cpu == 8
    assert AuditEvent.objects.filter(action="quota.update", workspace=world.ws).exists()


def test_the_fair_share_weight_and_the_intelligent_policy_are_set_in_the_admin(world, quotas):
    admin = login("admin@acme.test")
    url = f"{WS_QUOTAS}{quotas['ml'].pk}/change/"
    for bad in ("0", "-2"):
        refused = submit(admin, url, fair_share_weight=bad)
        assert refused.status_code == 200  # the form again, with the rule beside the field
        assert "must be greater than 0" in refused.content.decode()
    assert WorkspaceQuota.objects.get(pk=quotas["ml"].pk).fair_share_weight == 1
    assert submit(admin, url, fair_share_weight="3").status_code == 302
    assert WorkspaceQuota.objects.get(pk=quotas["ml"].pk).fair_share_weight == 3
    event = AuditEvent.objects.filter(action="quota.update").latest("id")
    assert event.changes == {"fair_share_weight": [1.0, 3.0]}

    org_url = f"{ORG_QUOTAS}{quotas['acme'].pk}/change/"
    assert submit(login("owner@acme.test"), org_url, policy="intelligent").status_code == 302
    assert OrgQuota.objects.get(pk=quotas["acme"].pk).policy == "intelligent"


GROUPS = "/admin/quotas/quotagroup/"


def test_quota_groups_are_listed_added_edited_and_deleted_through_the_service(world, quotas):
    admin = login("admin@acme.test")
    theirs = services.quota_group_create(
        actor=SYSTEM, organization=world.other_org, data={"name": "theirs"}
    )
    form = {"organization": world.org.pk, "name": "vision", "guaranteed_gpu": "4",
            "limit_gpu": "6", "fair_share_weight": "1",
            **{f"guaranteed_{r}": "0" for r in ("cpu", "memory_gb", "disk_gb")}}  # fmt: skip
    added = admin.post(f"{GROUPS}add/", form)
    assert added.status_code == 302, added.content.decode()[:3000]
    vision = QuotaGroup.objects.get(organization=world.org, name="vision")
    assert (vision.guaranteed_gpu, vision.limit_gpu) == (4, 6)
    assert AuditEvent.objects.filter(action="quota_group.create").count() == 2
    listing = admin.get(GROUPS).content.decode()
    assert f"{GROUPS}{vision.pk}/change/" in listing and f"{GROUPS}{theirs.pk}/" not in listing
    assert "4 / 6" in listing
    # the ml workspace joins it, in the workspace quota's page
    ws_url = f"{WS_QUOTAS}{quotas['ml'].pk}/change/"
    assert submit(admin, ws_url, group=str(vision.pk)).status_code == 302
    assert WorkspaceQuota.objects.get(pk=quotas["ml"].pk).group == vision
    ReservationFactory(job__workspace=world.ws, cpu=0, memory_gb=0, gpu=1)
    url = f"{GROUPS}{vision.pk}/change/"
    assert "gpu 1 of 6" in admin.get(url).content.decode()
    # a refusal of the service (lending more than it is guaranteed) changes nothing
    refused = submit(admin, url, lending_limit_gpu="5")
    assert refused.status_code == 302
    assert any("lending_limit_gpu" in m for m in messages_of(admin.get(url)))
    assert QuotaGroup.objects.get(pk=vision.pk).lending_limit_gpu is None
    assert submit(admin, url, lending_limit_gpu="1").status_code == 302
    assert QuotaGroup.objects.get(pk=vision.pk).lending_limit_gpu == 1
    # its GPU flavors: shown, written through the service, refused beyond its totals
    assert 'name="gpu_flavors"' in admin.get(url).content.decode()
    over = submit(admin, url, gpu_flavors='{"h100": {"guaranteed": 5}}')
    assert over.status_code == 302
    assert any("gpu_flavors.h100.guaranteed" in m for m in messages_of(admin.get(url)))
    assert submit(admin, url, gpu_flavors='{"h100": {"guaranteed": 2}}').status_code == 302
    assert QuotaGroup.objects.get(pk=vision.pk).gpu_flavors == {"h100": {"guaranteed": 2}}
    # a group with a workspace under it is not deleted; once empty, it is
    kept = admin.post(f"{url.removesuffix('change/')}delete/", {"post": "yes"})
    assert kept.status_code == 200 and "Cannot delete quota group" in kept.content.decode()
    assert QuotaGroup.objects.filter(pk=vision.pk).exists()
    services.workspace_quota_update(actor=SYSTEM, workspace=world.ws, data={"group": None})
    admin.post(f"{url.removesuffix('change/')}delete/", {"post": "yes"})
    assert not QuotaGroup.objects.filter(pk=vision.pk).exists()
    assert AuditEvent.objects.filter(action="quota_group.delete").count() == 1


def test_fair_share_preemption_is_a_box_on_the_quota_page_with_the_services_rule(world, quotas):
    owner = login("owner@acme.test")
    url = f"{ORG_QUOTAS}{quotas['acme'].pk}/change/"
    events = AuditEvent.objects.count()
    # ticked under fifo without preemption: the service refuses it, the page says why
    refused = submit(owner, url, fair_share_preemption="on")
    assert refused.status_code == 302
    shown = messages_of(owner.get(url))
    assert any("fair_share_preemption" in m and "needs policy fair_share" in m for m in shown)
    assert OrgQuota.objects.get(pk=quotas["acme"].pk).fair_share_preemption is False
    assert AuditEvent.objects.count() == events
    both = submit(owner, url, policy="fair_share", preemption="on", fair_share_preemption="on")
    assert both.status_code == 302
    quota = OrgQuota.objects.get(pk=quotas["acme"].pk)
    assert (quota.policy, quota.preemption, quota.fair_share_preemption) == (
        "fair_share",
        True,
        True,
    )
    # unticking preemption alone leaves fair-share preemption with nothing to do: refused
    assert submit(owner, url, preemption=None).status_code == 302
    assert OrgQuota.objects.get(pk=quotas["acme"].pk).preemption is True

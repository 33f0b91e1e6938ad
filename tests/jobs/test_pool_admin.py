"""Warm pools in the admin panel: an org admin sees each pool with its levels and clusters and
resizes it through the pool service (validated like the API, audited); another org's pool is a
404."""

from audit.models import AuditEvent
from jobs.models import WarmPool
from tests import factories as f
from tests.admin_forms import login, submit

POOLS = "/admin/jobs/warmpool/"


def test_an_org_admin_sees_and_resizes_a_pool_through_the_service(world):
    pool = f.WarmPoolFactory(organization=world.org)
    f.WarmClusterFactory(pool=pool)
    admin = login("admin@acme.test")
    listing = admin.get(POOLS)
    assert listing.status_code == 200 and f"{pool.pk}" in listing.content.decode()
    response = submit(admin, f"{POOLS}{pool.pk}/change/", size="3")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert WarmPool.objects.get(pk=pool.pk).size == 3
    event = AuditEvent.objects.get(action="warm_pool.update", target_id=str(pool.pk))
    assert event.actor_id == world.users["org_admin"].pk
    assert event.changes == {"size": [0, 3]}


def test_a_bad_size_is_refused_and_nothing_changes(world):
    pool = f.WarmPoolFactory(organization=world.org)
    admin = login("admin@acme.test")
    submit(admin, f"{POOLS}{pool.pk}/change/", size="1000")
    assert WarmPool.objects.get(pk=pool.pk).size == 0


def test_another_orgs_pool_is_not_found(world):
    pool = f.WarmPoolFactory(organization=world.other_org)
    admin = login("admin@acme.test")
    assert admin.get(f"{POOLS}{pool.pk}/change/").status_code != 200
    assert f"{POOLS}{pool.pk}/change/" not in admin.get(POOLS).content.decode()
    mine = f.WarmPoolFactory(organization=world.org)
    assert f"{POOLS}{mine.pk}/change/" in admin.get(POOLS).content.decode()

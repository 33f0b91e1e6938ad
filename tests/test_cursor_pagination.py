"""Cursor pages on the long lists (jobs, a job's events, the audit log, a webhook's
deliveries): a walk returns every row once, in the list's order, while rows are added; page
numbers keep working as before and hand out a cursor to go on from; a cursor the list did not
give out is a 400 naming the parameter."""

from __future__ import annotations

import base64
import datetime as dt
import json
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from audit.context import Actor
from jobs.models import Job
from tests import factories as f

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"


def cursor_of(link: str) -> str:
    return parse_qs(urlsplit(link).query, keep_blank_values=True)["cursor"][0]


def walk(client, url: str, *, page_size: int, between=None) -> list[int]:
    """The ids a cursor walk from the top shows, calling ``between()`` after each page."""
    shown, cursor = [], ""
    while cursor is not None:
        response = client.get(url, {"cursor": cursor, "page_size": page_size})
        assert response.status_code == 200, response.content
        body = response.json()
        assert "count" not in body and "next_cursor" not in body
        shown += [row["id"] for row in body["results"]]
        cursor = cursor_of(body["next"]) if body["next"] else None
        if between:
            between()
    return shown


def jobs_in_bulk(world, template, n: int) -> list[int]:
    one = f.JobFactory.build(
        workspace=world.ws,
        template_version=template.versions.get(),
        submitted_by=world.users["developer"],
    )
    fields = [field.attname for field in Job._meta.concrete_fields if not field.primary_key]
    made = Job.objects.bulk_create(Job(**{k: getattr(one, k) for k in fields}) for _ in range(n))
    return [job.pk for job in made]


def test_a_cursor_walk_shows_every_job_once_in_order_while_jobs_are_added(world, template):
    before = sorted(jobs_in_bulk(world, template, 23), reverse=True)
    added = []
    shown = walk(
        world.client("viewer"),
        JOBS,
        page_size=5,
        between=lambda: added.extend(jobs_in_bulk(world, template, 2)),
    )
    assert shown == before  # newest first; the ones added meanwhile are above the walk
    assert len(added) == 2 * 5


def test_page_numbers_and_cursors_show_the_same_rows(world, template):
    jobs_in_bulk(world, template, 17)
    client = world.client("viewer")
    pages = [client.get(JOBS, {"page": n, "page_size": 5}).json() for n in (1, 2, 3, 4)]
    assert [p["next"] is not None for p in pages] == [True, True, True, False]
    assert pages[0]["next"].endswith("?page=2&page_size=5")  # as before
    assert [p["next_cursor"] is not None for p in pages] == [True, True, True, False]
    by_number = [row["id"] for page in pages for row in page["results"]]
    assert walk(client, JOBS, page_size=5) == by_number
    # From page 2, its next_cursor gives what page 3 gives, and so on from there.
    after_two = client.get(pages[1]["next_cursor"]).json()
    assert after_two["results"] == pages[2]["results"]
    assert (
        after_two["previous"]
        and client.get(after_two["previous"]).json()["results"] == (pages[1]["results"])
    )


def test_filters_carry_over_to_the_cursor_links(world, template):
    jobs_in_bulk(world, template, 6)
    mine = f.JobFactory(workspace=world.ws, submitted_by=world.users["developer2"])
    client = world.client("viewer")
    first = client.get(JOBS, {"submitter": "dev2@acme.test", "cursor": "", "page_size": 1})
    assert [row["id"] for row in first.json()["results"]] == [mine.pk]
    assert first.json()["next"] is None


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64!",
        "e30",  # {}
        base64.urlsafe_b64encode(b'{"a":["abc"]}').decode(),  # not an id
        base64.urlsafe_b64encode(b'{"a":[1,2]}').decode(),  # not this list's key
        base64.urlsafe_b64encode(b'{"x":[1]}').decode(),
        base64.urlsafe_b64encode(b'{"a":[null]}').decode(),
        base64.urlsafe_b64encode(b"[1]").decode(),
    ],
)
def test_a_cursor_the_list_did_not_give_out_is_a_400_naming_it(world, cursor):
    response = world.client("viewer").get(JOBS, {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert "not a cursor this list gave out" in response.json()["errors"]["cursor"][0]


def test_a_cursor_and_a_page_number_together_are_refused(world):
    response = world.client("viewer").get(JOBS, {"cursor": "", "page": 2})
    assert response.status_code == 400
    assert "cannot be combined with page" in response.json()["errors"]["cursor"][0]


def test_an_unknown_parameter_is_still_refused_with_a_cursor(world):
    response = world.client("viewer").get(JOBS, {"cursor": "", "stat": "queued"})
    assert response.status_code == 400 and "stat" in response.json()["errors"]


def test_a_jobs_events_walk_oldest_first(world, template):
    job = f.JobFactory(workspace=world.ws, template_version=template.versions.get())
    events = [f.JobEventFactory(job=job).pk for _ in range(7)]
    shown = walk(world.client("viewer"), f"{JOBS}{job.pk}/events/", page_size=3)
    assert shown == sorted(events)


def test_an_audit_walk_newest_first(world):
    actor = Actor.for_user(world.users["owner"])
    made = [f.AuditEventFactory(organization=world.org, actor=actor).pk for _ in range(9)]
    url = "/api/v1/orgs/acme/audit-events/"
    shown = walk(world.client("owner"), url, page_size=4)
    assert shown[: len(made)] == sorted(made, reverse=True)
    total = world.client("owner").get(url).json()["count"]
    assert len(shown) == len(set(shown)) == total


def test_a_delivery_walk_keeps_rows_that_share_a_time(world):
    """Deliveries are ordered by when their event occurred, then id: rows at the same instant
    are neither repeated nor skipped at a page's edge."""
    endpoint = f.WebhookEndpointFactory(workspace=world.ws)
    instant = timezone.now() - dt.timedelta(minutes=5)
    made = []
    for index in range(11):
        delivery = f.WebhookDeliveryFactory(endpoint=endpoint)
        at = instant if index % 3 else instant - dt.timedelta(seconds=index)
        type(delivery).objects.filter(pk=delivery.pk).update(occurred_at=at)
        made.append((at, delivery.pk))
    url = f"/api/v1/orgs/acme/workspaces/ml/webhooks/{endpoint.pk}/deliveries/"
    shown = walk(world.client("ws_admin"), url, page_size=2)
    assert shown == [pk for _, pk in sorted(made, reverse=True)]


def test_the_cursor_is_opaque_json_of_the_last_rows_key(world, template):
    ids = jobs_in_bulk(world, template, 3)
    body = world.client("viewer").get(JOBS, {"page_size": 2}).json()
    raw = cursor_of(body["next_cursor"])
    assert json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))) == {
        "a": [sorted(ids)[1]]
    }

"""Driving admin pages as a browser would: sign in, read a form's current values from the page,
change some and post it back."""

from __future__ import annotations

from html.parser import HTMLParser

from django.test import Client

from tests.conftest import PASSWORD


def login(email: str) -> Client:
    client = Client()
    assert client.login(email=email, password=PASSWORD)
    return client


class _FormValues(HTMLParser):
    """The values a browser would submit from the page's forms (checked boxes, selected options,
    textarea text; buttons and files left out)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.values: dict[str, str | list[str]] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio"):
                if "checked" in a:
                    self.values[name] = a.get("value") or "on"
            else:
                self.values[name] = a.get("value") or ""
        elif tag == "select" and name:
            self._select = name
            self.values.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in a:
            self.values[self._select] = a.get("value") or ""
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_data(self, data):
        if self._textarea:
            self.values[self._textarea] += data

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            if self._textarea:  # a textarea's first newline is not part of its value
                self.values[self._textarea] = self.values[self._textarea].removeprefix("\n")
            self._textarea = None


def form_values(client: Client, url: str) -> dict:
    page = client.get(url)
    assert page.status_code == 200, (url, page.status_code)
    parser = _FormValues()
    parser.feed(page.content.decode())
    parser.values.pop("csrfmiddlewaretoken", None)
    return parser.values


def submit(client: Client, url: str, /, **changes):
    """Post the form at ``url`` with its current values and ``changes`` (None unsets a box)."""
    values = form_values(client, url)
    for name, value in changes.items():
        if value is None:
            values.pop(name, None)
        else:
            values[name] = value
    return client.post(url, values)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def act(client: Client, listing: str, action: str, ids) -> list[str]:
    """Run a list page's ``action`` on rows ``ids``; the messages shown after it."""
    response = client.post(
        listing,
        {"action": action, "index": "0", "_selected_action": [str(i) for i in ids]},
        follow=True,
    )
    assert response.status_code == 200, response.status_code
    return messages_of(response)

"""Static files and the API docs under gunicorn with DEBUG off, as production runs: the admin's
stylesheet is served, and /api/docs/ (Swagger UI) and /api/redoc/ (ReDoc) load every script,
style and icon from this service, so they work with no internet access. Both ways static files
are served (config/settings.py): found in the installed apps (any checkout, no collectstatic),
and the compressed copy collectstatic made in STATIC_ROOT (the image)."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import requests
from django.conf import settings

from tests.e2e.servers import Api

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["/api/docs/", "/api/redoc/"]


def server_env(var: Path, **extra: str) -> dict[str, str]:
    """The production settings (config.settings, DEBUG off) on the test database."""
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "false",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "MANTA_VAR_DIR": str(var),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@pytest.fixture(scope="module")
def api(django_db_setup, tmp_path_factory):
    var = tmp_path_factory.mktemp("static-finders")
    server = Api(server_env(var), var / "api.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def collected_api(django_db_setup, tmp_path_factory):
    """What the image does: collectstatic at build, then serve that copy."""
    var = tmp_path_factory.mktemp("static-collected")
    env = server_env(var, STATIC_ROOT=str(var / "collected"), MANTA_STATIC_COLLECTED="true")
    done = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    server = Api(env, var / "api.log")
    server.start()
    yield server
    server.stop()


class Assets(HTMLParser):
    """Every src and href of a page."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def assets_of(html: str) -> list[str]:
    parser = Assets()
    parser.feed(html)
    return parser.urls


def test_the_admin_stylesheet_is_served_with_debug_off(api):
    response = requests.get(f"{api.base}/static/admin/css/base.css", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/css")
    assert "body" in response.text


def test_a_missing_static_file_is_404(api):
    response = requests.get(f"{api.base}/static/admin/css/no-such-file.css", timeout=10)
    assert response.status_code == 404


@pytest.mark.parametrize("page", DOCS)
def test_docs_load_only_same_origin_assets_and_each_answers(api, page):
    response = requests.get(api.base + page, timeout=30)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    urls = assets_of(response.text)
    assert any(urlsplit(url).path.endswith(".js") for url in urls), urls
    foreign = [url for url in urls if urlsplit(url).scheme or urlsplit(url).netloc]
    assert not foreign, foreign
    # nor in an inline script or style (a CDN, web fonts, an online validator)
    assert "http://" not in response.text and "https://" not in response.text
    for url in urls:
        asset = requests.get(urljoin(api.base + page, url), timeout=30)
        assert asset.status_code == 200, url
        assert asset.content, url


def test_the_schema_the_docs_read_answers(api):
    response = requests.get(f"{api.base}/api/schema/", timeout=60)
    assert response.status_code == 200
    assert response.text.startswith("openapi: 3")


def test_the_collected_copy_is_served_compressed(collected_api):
    base = collected_api.base
    for path, kind in [
        ("/static/admin/css/base.css", "text/css"),
        ("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js", "text/javascript"),
    ]:
        plain = requests.get(base + path, headers={"Accept-Encoding": "identity"}, timeout=10)
        assert plain.status_code == 200 and plain.headers["Content-Type"].startswith(kind)
        assert "Content-Encoding" not in plain.headers
        gzipped = requests.get(base + path, headers={"Accept-Encoding": "gzip"}, timeout=10)
        assert gzipped.status_code == 200 and gzipped.headers["Content-Encoding"] == "gzip"
        assert gzipped.content == plain.content  # requests decompresses
    for page in DOCS:
        response = requests.get(base + page, timeout=30)
        assert response.status_code == 200
        for url in assets_of(response.text):
            assert requests.get(urljoin(base + page, url), timeout=30).status_code == 200, url

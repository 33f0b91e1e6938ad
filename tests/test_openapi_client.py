"""Every operation of the OpenAPI schema generates with openapi-python-client, without a warning,
and the generated client imports and talks to the real API (a package upload, the operation that
was once skipped, and a job list).

openapi-python-client pins httpx and typer below the project's own pins, so it runs from its own
venv, ``.venv-openapi`` (``make test`` builds it from ``requirements-openapi.lock``)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from tests.conftest import build_world

ROOT = Path(__file__).resolve().parents[1]
TOOL_VENV = ROOT / ".venv-openapi"
GENERATOR = TOOL_VENV / "bin" / "openapi-python-client"
# Printed by the generator for anything it leaves out or could not finish.
TROUBLE = re.compile(r"warning|error|will not be generated|skipping|omitted|not in path", re.I)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict, str]:
    """The schema ``manage.py spectacular`` writes, the client generated from it, the output."""
    assert GENERATOR.exists(), f"{GENERATOR} is missing: `make test-tools` builds it"
    work = tmp_path_factory.mktemp("openapi-client")
    schema_file = work / "schema.yaml"
    call_command("spectacular", file=str(schema_file), validate=True)
    # The generator's post-hooks run ruff from PATH: the tool venv's own.
    env = {**os.environ, "PATH": f"{TOOL_VENV / 'bin'}:{os.environ['PATH']}"}
    run = subprocess.run(
        [str(GENERATOR), "generate", "--path", str(schema_file), "--meta", "none",
         "--output-path", str(work / "manta_api")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    return work, yaml.safe_load(schema_file.read_text()), output


def tool_python(work: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TOOL_VENV / "bin" / "python"), "-c", textwrap.dedent(code)],
        cwd=work, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_every_operation_generates_without_a_warning(generated):
    work, schema, output = generated
    assert not TROUBLE.search(output), output
    # Each operation is a module named for its id; none was left out.
    modules = {path.stem for path in (work / "manta_api" / "api").rglob("*.py")}
    operation_ids = {
        operation["operationId"]
        for item in schema["paths"].values()
        for method, operation in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    }
    assert len(operation_ids) > 80
    assert operation_ids <= modules, sorted(operation_ids - modules)


def test_the_generated_client_imports(generated):
    work, _schema, _output = generated
    run = tool_python(
        work,
        """
        import importlib, pkgutil
        import manta_api, manta_api.api
        names = [m.name for m in pkgutil.walk_packages(manta_api.api.__path__, "manta_api.api.")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
        """,
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) > 80


def test_the_generated_client_uploads_a_package(generated, live_server, transactional_db):
    """The upload, sent as the schema describes it (raw bytes, application/octet-stream), is a
    201 with the package; the same content again is a 200."""
    work, _schema, _output = generated
    world = build_world()
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w") as archive:
        archive.writestr("train.py", "print('hello')\n")
    (work / "code.zip").write_bytes(body.getvalue())
    run = tool_python(
        work,
        """
        import json, os
        from manta_api import AuthenticatedClient
        from manta_api.api.orgs import packages_upload, jobs_list
        from manta_api.types import File
        client = AuthenticatedClient(base_url=os.environ["URL"], token=os.environ["TOKEN"])
        answers = []
        for _ in range(2):
            with open("code.zip", "rb") as payload:
                response = packages_upload.sync_detailed(
                    "acme", "ml", client=client, body=File(payload=payload)
                )
            answers.append([response.status_code, response.parsed.uri])
        jobs = jobs_list.sync_detailed("acme", "ml", client=client)
        answers.append([jobs.status_code, jobs.parsed.count])
        print(json.dumps(answers))
        """,
        URL=live_server.url,
        TOKEN=world.tokens["developer"],
    )
    assert run.returncode == 0, run.stderr
    (created, uri), (again, same_uri), (listed, count) = json.loads(run.stdout)
    assert (created, again, listed, count) == (201, 200, 200, 0)
    assert uri == same_uri and uri.startswith("manta://packages/")
    assert world.ws.packages.get().uri == uri

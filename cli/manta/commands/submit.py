"""``manta submit``: a job from a template or ad hoc, with a local directory as its code."""

from __future__ import annotations

import shlex
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import output
from ..client import Client
from ..errors import ApiError
from ..responses import Template
from ..workdir import package_working_dir
from . import common
from .common import NotSupportedByServer, OutputOption, RawOption, UsageProblem, info, use
from .watch import finish, follow_until_done

ADHOC_WORKERS = {"name": "workers", "replicas": 1, "cpu": 1, "gpu": 0, "memory_gb": 1}
ADHOC_HEAD = {"cpu": 0, "memory_gb": 1}


def submit(
    ctx: typer.Context,
    entrypoint: Annotated[
        list[str] | None,
        typer.Argument(help="The command the job runs (after --)", show_default=False),
    ] = None,
    template: Annotated[
        str | None, typer.Option(help="Submit from this template of the workspace (its name)")
    ] = None,
    working_dir: Annotated[
        Path | None,
        typer.Option(
            help="Upload this directory (less what .gitignore and .mantaignore leave out, and "
            ".git) as the job's working_dir"
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(help="Run code from this git code source of the workspace (its name)"),
    ] = None,
    ref: Annotated[
        str | None,
        typer.Option(help="The branch, tag or commit of --source (default: the source's)"),
    ] = None,
    image: Annotated[str | None, typer.Option(help="The Ray image (ad-hoc jobs need one)")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker replicas", min=0)] = None,
    cpu: Annotated[float | None, typer.Option(help="CPUs per worker", min=0)] = None,
    gpu: Annotated[int | None, typer.Option(help="GPUs per worker", min=0)] = None,
    memory_gb: Annotated[float | None, typer.Option(help="Memory per worker, GB", min=0)] = None,
    name: Annotated[str | None, typer.Option(help="The job's name")] = None,
    follow_job: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Show its state and stream its log until it ends (Ctrl-C asks to cancel it)",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Submit nothing: say whether the job would start now, its place in the queue, "
            "what it would wait for and when it is expected to start",
        ),
    ] = False,
    raw: RawOption = False,
    output_format: OutputOption = None,
) -> None:
    """Submit a job, from a template or ad hoc, optionally with a local directory as its code.

    From a template with --template NAME, ad hoc with --image. --working-dir uploads the
    directory unless the workspace has that content already. One word after -- is taken as a
    shell line; several are quoted and joined.

    Example: manta submit --template train --working-dir . --follow -- python train.py --epochs 3
    """
    state = use(ctx, output_format)
    words = list(entrypoint or [])
    if not template and not words:
        raise UsageProblem("give the entrypoint after --, or --template NAME")
    if not template and not image:
        raise UsageProblem("an ad-hoc job needs --image (or submit from a --template NAME)")
    if source and working_dir:
        raise UsageProblem("give --working-dir or --source, not both")
    if ref and not source:
        raise UsageProblem("--ref picks a commit of a --source")
    code = {"source": source, **({"ref": ref} if ref else {})} if source else None
    sizes = {"replicas": workers, "cpu": cpu, "gpu": gpu, "memory_gb": memory_gb}
    with common.client() as client:
        found = None
        if template:
            found = client.find_template(template)
            if found is None:
                where = f"{client.org}/{client.workspace}"
                raise UsageProblem(f"no template named {template!r} in {where}")
        uri = upload_working_dir(client, working_dir) if working_dir else None
        if found is not None:
            overrides = template_overrides(found, words, image, uri, sizes)
            if code:
                overrides["code"] = code
            submission: dict[str, Any] = {"template": found["id"], "overrides": overrides}
        else:
            spec = {
                "image": image,
                "entrypoint": join_entrypoint(words),
                "runtime_env": {"working_dir": uri} if uri else {},
                "head": dict(ADHOC_HEAD),
                "worker_groups": [_resize(ADHOC_WORKERS, sizes)],
                **({"code": code} if code else {}),
            }
            submission = {"spec": spec}
        if dry_run:
            answer = client.dry_run_job(**submission, name=name or "")
            output.show_dry_run(answer, as_json=state.as_json)
            return
        job = client.submit_job(
            **submission,
            name=name or "",
            idempotency_key=_key(),
            include_position=not follow_job,  # shown below; following reads the job's detail
        )
        if not follow_job:
            output.show_job(job, as_json=state.as_json, submitted=True)
            return
        info(f"submitted job {job['id']} ({job.get('name', '')})")
        final = follow_until_done(client, job, state, offer_cancel=True, raw=raw)
    finish(state, final)


def join_entrypoint(words: list[str]) -> str:
    """One word is the shell line it is (``"pip list && python x.py"``); several are quoted
    and joined, so ``-- python -c "print(1)"`` runs what it says."""
    return words[0] if len(words) == 1 else shlex.join(words)


def template_overrides(
    template: Template,
    words: list[str],
    image: str | None,
    uri: str | None,
    sizes: dict[str, Any],
) -> dict[str, Any]:
    """What to override in the template. An override replaces a spec field whole, so the
    working_dir is added to the template's own runtime_env and the sizes to its worker group."""
    base = template.get("spec") or {}
    overrides: dict[str, Any] = {}
    if words:
        overrides["entrypoint"] = join_entrypoint(words)
    if image:
        overrides["image"] = image
    if uri:
        overrides["runtime_env"] = {**(base.get("runtime_env") or {}), "working_dir": uri}
    if any(value is not None for value in sizes.values()):
        groups = base.get("worker_groups") or [{"name": "workers"}]
        if len(groups) != 1:
            raise UsageProblem(
                f"template {template.get('name')!r} has {len(groups)} worker groups; "
                "--workers/--cpu/--gpu/--memory-gb resize a template with one"
            )
        overrides["worker_groups"] = [_resize(groups[0], sizes)]
    return overrides


def _resize(group: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    return {**group, **{key: value for key, value in sizes.items() if value is not None}}


def upload_working_dir(client: Client, directory: Path) -> str:
    """Package ``directory`` and upload it unless the workspace has that content already; the
    package's URI."""
    try:
        package = package_working_dir(directory)
    except OSError as exc:
        raise UsageProblem(f"--working-dir: {exc}") from exc
    if not package.files:
        raise UsageProblem(f"--working-dir: no files to package in {directory}")
    if package.skipped_links:
        shown = ", ".join(package.skipped_links[:5])
        info(f"left out {len(package.skipped_links)} symbolic link(s): {shown}")
    size = f"{package.size / 1024:.1f} KiB"
    what = f"package {package.sha256[:12]} ({len(package.files)} files, {size})"
    try:
        existing = client.package(package.sha256)
    except ApiError as exc:
        if exc.status == 404:
            raise NotSupportedByServer(
                "this server does not take code packages (it has no packages endpoint); "
                "--working-dir needs a newer Manta"
            ) from exc
        raise
    if existing is not None:
        info(f"{what}: already uploaded")
        return existing["uri"]
    uploaded = client.upload_package(package.data)
    info(f"{what}: uploaded")
    return uploaded["uri"]


def _key() -> str:
    return f"manta-cli-{uuid.uuid4()}"

"""Code sources: git repositories a workspace runs code from, and fetching one commit of them.

A fetch is hostile input end to end: the URL passes the SSRF policy when the source is saved and
again before every fetch, and git is then pinned to the address that was checked (so a DNS
answer that changes in between cannot lead it inward); only the URL's own protocol is allowed
(no ``file://``, no ``ext::`` helpers, no submodules, no redirects); git runs without the
service's environment, as an unprivileged user where the worker is root, in a fresh directory,
bounded in time and in file size. The commit is archived with ``git archive`` and stored as a
code package, checked like an upload.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from typing import Any

from django.conf import settings
from django.db import transaction

from audit import services as audit
from audit.context import Actor
from config import secrets as secrets_box
from config import ssrf
from config.errors import Conflict, DomainError, InvalidInput
from workspaces.archive import require_active
from workspaces.models import Workspace

from .models import GIT_REF, GIT_REF_RULE, MAX_REF, CodePackage, CodeSource
from .services import package_store

COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_KEY = 16 * 1024
NOBODY = 65534


class CodeUnavailable(DomainError):
    """The source could not be fetched or packaged; the message says why."""


def check_ref(value: Any, *, field: str = "ref") -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_REF or not GIT_REF.match(value):
        raise InvalidInput.on(field, GIT_REF_RULE)
    return value


def check_url(url: Any, *, field: str = "url") -> str:
    if not isinstance(url, str) or not url or len(url) > 500 or any(c.isspace() for c in url):
        raise InvalidInput.on(field, "must be a URL of at most 500 characters without spaces")
    if "://" not in url:
        raise InvalidInput.on(
            field,
            "must be an https://, ssh:// (or, where allowed, git:// or http://) URL; host paths "
            "and scp-like addresses (git@host:path) are refused: write ssh://git@host/path",
        )
    try:
        ssrf.check_git_url(
            url,
            settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS,
            settings.MANTA_CODE_SOURCE_ALLOW_PLAIN,
        )
    except ssrf.UnsafeURL as exc:
        raise InvalidInput.on(field, str(exc)) from exc
    return url


def check_deploy_key(value: Any, *, field: str = "deploy_key") -> str:
    if not isinstance(value, str) or len(value) > MAX_KEY or "\0" in value:
        raise InvalidInput.on(field, f"must be a text of at most {MAX_KEY} characters")
    text = value.strip()
    if not (text.startswith("-----BEGIN ") and "PRIVATE KEY-----" in text):
        raise InvalidInput.on(field, "must be an SSH private key (-----BEGIN … PRIVATE KEY-----)")
    return text + "\n"


def check_known_hosts(value: Any, *, field: str = "known_hosts") -> str:
    if not isinstance(value, str) or len(value) > MAX_KEY or "\0" in value:
        raise InvalidInput.on(field, f"must be a text of at most {MAX_KEY} characters")
    return value.strip()


# --- the sources of a workspace ----------------------------------------------------------------


def _public(source: CodeSource) -> dict[str, Any]:
    return {
        "url": source.url,
        "default_ref": source.default_ref,
        "known_hosts": bool(source.known_hosts),
        "deploy_key": source.has_deploy_key,
    }


@transaction.atomic
def source_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    url: str,
    default_ref: str = "main",
    deploy_key: str = "",
    known_hosts: str = "",
) -> CodeSource:
    require_active(workspace)
    if CodeSource.objects.filter(workspace=workspace, name=name).exists():
        raise Conflict(f"code source {name!r} exists", errors={"name": ["already taken"]})
    key = secrets_box.encrypt(check_deploy_key(deploy_key)) if deploy_key else ""
    source = CodeSource.objects.create(
        workspace=workspace,
        name=name,
        url=check_url(url),
        default_ref=check_ref(default_ref, field="default_ref"),
        deploy_key_encrypted=key,
        known_hosts=check_known_hosts(known_hosts),
        created_by=actor.user,
    )
    audit.record(
        actor=actor,
        action="code_source.create",
        target=source,
        target_repr=f"code source {name}",
        workspace=workspace,
        changes={key: [None, value] for key, value in _public(source).items()},
    )
    return source


@transaction.atomic
def source_update(*, actor: Actor, source: CodeSource, data: dict[str, Any]) -> CodeSource:
    source = CodeSource.objects.select_for_update().get(pk=source.pk)
    require_active(source.workspace)
    before = _public(source)
    if "url" in data:
        source.url = check_url(data["url"])
    if "default_ref" in data:
        source.default_ref = check_ref(data["default_ref"], field="default_ref")
    if "deploy_key" in data:  # an empty key removes it
        key = data["deploy_key"]
        source.deploy_key_encrypted = secrets_box.encrypt(check_deploy_key(key)) if key else ""
    if "known_hosts" in data:
        source.known_hosts = check_known_hosts(data["known_hosts"])
    source.save()
    after = _public(source)
    changes = {key: [before[key], after[key]] for key in after if before[key] != after[key]}
    if "deploy_key" in data and "deploy_key" not in changes:
        changes["deploy_key"] = ["replaced", "replaced"]
    audit.record(
        actor=actor,
        action="code_source.update",
        target=source,
        target_repr=f"code source {source.name}",
        workspace=source.workspace,
        changes=changes,
    )
    return source


@transaction.atomic
def source_delete(*, actor: Actor, source: CodeSource) -> None:
    audit.record(
        actor=actor,
        action="code_source.delete",
        target=source,
        target_repr=f"code source {source.name}",
        workspace=source.workspace,
        changes={key: [value, None] for key, value in _public(source).items()},
    )
    source.delete()


def source_require(workspace: Workspace, name: Any, *, field: str) -> CodeSource:
    source = (
        CodeSource.objects.filter(workspace=workspace, name=name).first()
        if isinstance(name, str)
        else None
    )
    if source is None:
        raise InvalidInput.on(field, f"no code source {name!r} in this workspace")
    return source


# --- fetching ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fetched:
    commit: str
    package: CodePackage


def fetch(source: CodeSource, ref: str, *, actor: Actor) -> Fetched:
    """Fetch ``ref`` (a branch, tag or commit) of ``source``, package that commit for its
    workspace and return both. Raises :class:`CodeUnavailable` naming what failed."""
    check_ref(ref)
    try:
        where = ssrf.check_git_url(
            source.url,
            settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS,
            settings.MANTA_CODE_SOURCE_ALLOW_PLAIN,
        )
    except ssrf.UnsafeURL as exc:
        raise CodeUnavailable(f"code source {source.name!r}: {exc}") from exc
    work = tempfile.mkdtemp(prefix="manta-git-")
    try:
        os.chmod(work, 0o700)
        git = _Git(work, source, where)
        git.run("init", "-q", "--bare", "repo")
        git.run("fetch", "-q", "--depth", "1", "--no-tags", "--", git.url, ref, network=True)
        commit = git.run("rev-parse", "--verify", "FETCH_HEAD^{commit}").strip()
        git.run("archive", "--format=zip", "-o", os.path.join(work, "code.zip"), commit)
        try:
            package, _ = package_store(
                actor=actor,
                workspace=source.workspace,
                path=os.path.join(work, "code.zip"),
                metadata={"code_source": source.name, "commit": commit},
            )
        except DomainError as exc:
            raise CodeUnavailable(f"commit {commit[:12]} of {source.name!r}: {exc}") from exc
        return Fetched(commit=commit, package=package)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Git:
    """git, pinned to one checked address and one protocol, run as nobody in ``work``."""

    def __init__(self, work: str, source: CodeSource, where: ssrf.Destination) -> None:
        self.work, self.source, self.where = work, source, where
        self.as_nobody = os.geteuid() == 0
        address = f"[{where.address}]" if ":" in where.address else where.address
        self.url = source.url
        self.config = [
            "-c", "protocol.allow=never",
            "-c", f"protocol.{where.scheme}.allow=always",
            "-c", "http.followRedirects=false",
            "-c", "core.hooksPath=/dev/null",
            "-c", "submodule.recurse=false",
            "-c", "credential.helper=",
        ]  # fmt: skip
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": work,
            "LANG": "C.UTF-8",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "/bin/false",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ALLOW_PROTOCOL": where.scheme,
        }
        if where.scheme in ("https", "http"):
            self.config += ["-c", f"http.curloptResolve={where.host}:{where.port}:{address}"]
        elif where.scheme == "git":  # the git protocol has no name to keep: connect to the address
            parts = self.url.split("/", 3)
            parts[2] = f"{address}:{where.port}"
            self.url = "/".join(parts)
        elif where.scheme == "ssh":
            self.env["GIT_SSH_COMMAND"] = self._ssh(address.strip("[]"))
        if self.as_nobody:
            os.chown(work, NOBODY, NOBODY)

    def _ssh(self, address: str) -> str:
        known = os.path.join(self.work, "known_hosts")
        self._write(known, self.source.known_hosts + "\n")
        options = [
            "ssh", "-F", "/dev/null",
            "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes",
            "-o", f"HostName={address}",
            "-o", f"HostKeyAlias={self.where.host}",
            "-o", f"UserKnownHostsFile={known}",
            "-o", "StrictHostKeyChecking=" + ("yes" if self.source.known_hosts else "no"),
            "-o", "ProxyCommand=none",
            "-o", "ConnectTimeout=15",
        ]  # fmt: skip
        if self.source.deploy_key_encrypted:
            key = os.path.join(self.work, "deploy_key")
            self._write(key, secrets_box.decrypt(self.source.deploy_key_encrypted))
            options += ["-i", key]
        else:
            options += ["-o", "IdentityFile=none"]
        return shlex.join(options)

    def _write(self, path: str, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if self.as_nobody:
            os.chown(path, NOBODY, NOBODY)

    def run(self, *args: str, network: bool = False) -> str:
        command = ["git", "-C", self.work if args[0] == "init" else f"{self.work}/repo"]
        command += [*self.config, *args]
        # Bounded: no file larger than an unpacked package, no run longer than the fetch limit.
        limit = settings.MANTA_PACKAGE_MAX_UNPACKED_BYTES
        command = ["prlimit", f"--fsize={limit}", "--", *command]
        if self.as_nobody:
            drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
            command = [*drop, *command]
        timeout = settings.MANTA_CODE_FETCH_SECONDS
        process = subprocess.Popen(
            command,
            env=self.env,
            cwd=self.work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise CodeUnavailable(
                f"git {args[0]} of {self.source.name!r} took longer than {timeout}s "
                "(MANTA_CODE_FETCH_SECONDS)"
            ) from None
        if process.returncode != 0:
            what = _last_line(err) or f"exit code {process.returncode}"
            if network:
                what = f"{what} (fetching {args[-1]!r} from {self.source.url})"
            raise CodeUnavailable(f"git {args[0]} of {self.source.name!r} failed: {what}")
        return out


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""

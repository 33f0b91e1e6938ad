"""Where the CLI talks to and as whom: the user's stored login and context, with the environment
(``MANTA_URL``, ``MANTA_TOKEN``, ``MANTA_ORG``, ``MANTA_WORKSPACE``) on top, for CI."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import typer

ENV_NAMES = {
    "url": "MANTA_URL",
    "token": "MANTA_TOKEN",
    "org": "MANTA_ORG",
    "workspace": "MANTA_WORKSPACE",
}


@dataclass
class StoredConfig:
    """What ``config.json`` holds."""

    url: str = ""
    token: str = ""
    token_id: int | None = None
    email: str = ""
    org: str = ""
    workspace: str = ""


@dataclass
class Settings:
    """The values in force, and where each came from (``env``, ``config`` or ``flag``)."""

    url: str
    token: str
    org: str
    workspace: str
    sources: dict[str, str]


def config_path() -> Path:
    return Path(typer.get_app_dir("manta")) / "config.json"


def load() -> StoredConfig:
    path = config_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return StoredConfig()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    known = {f.name for f in fields(StoredConfig)}
    return StoredConfig(**{k: v for k, v in raw.items() if k in known})


def save(config: StoredConfig) -> Path:
    """Write the config readable by its owner only (0600, in a 0700 directory), replacing the
    old file in one step so a crash never leaves half a file."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(config), out, indent=2)
            out.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def resolve(
    stored: StoredConfig,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, str | None] | None = None,
) -> Settings:
    """Each value from the command's flag, else the environment, else the stored config."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name, env_name in ENV_NAMES.items():
        flag = (flags or {}).get(name)
        if flag:
            values[name], sources[name] = flag, "flag"
        elif environ.get(env_name):
            values[name], sources[name] = environ[env_name], "env"
        else:
            values[name] = getattr(stored, name) or ""
            sources[name] = "config" if values[name] else ""
    return Settings(**values, sources=sources)


class ConfigError(Exception):
    """The stored config cannot be used."""

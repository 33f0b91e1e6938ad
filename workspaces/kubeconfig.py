"""What a tenant's kubeconfig may hold.

A kubeconfig is more than an address and a credential: ``users[].user.exec`` runs a command
and ``auth-provider`` runs a plugin, both inside the Celery worker that loads it, and every file
reference (``client-certificate``, ``certificate-authority``, ``tokenFile``, ``*-file``) reads a
file of the worker's host. Only inline credentials (``token``, ``client-certificate-data``,
``certificate-authority-data``, ``username``/``password``) are accepted. No Django here: the
API checks at save and the ``kuberay`` launcher again before it connects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

_CODE = {
    "exec": "exec plugins run a command inside the worker; use an inline token or client "
    "certificate",
    "auth-provider": "auth providers run code inside the worker; use an inline token or client "
    "certificate",
}
_FILES = frozenset({"client-certificate", "client-key", "certificate-authority", "tokenFile"})


def load(text: Any) -> Mapping[str, Any]:
    """The kubeconfig mapping from its YAML text (or a mapping). ValueError naming the rule."""
    if isinstance(text, Mapping):
        return text
    if not isinstance(text, str):
        raise ValueError("must be the kubeconfig's YAML text")
    if "\n" not in text and not text.lstrip().startswith("{"):
        raise ValueError(
            "must be the kubeconfig's YAML text; paths on the worker's host are refused"
        )
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"is not valid YAML: {exc}") from exc
    if not isinstance(config, Mapping):
        raise ValueError("must be a kubeconfig (a YAML mapping)")
    return config


def problems(config: Mapping[str, Any]) -> list[str]:
    """Each part of ``config`` that would run code or read a file in the worker, with the rule."""
    found = []
    for section, inner in (("users", "user"), ("clusters", "cluster"), ("contexts", "context")):
        entries = config.get(section) or []
        if not isinstance(entries, list):
            found.append(f"{section}: must be a list")
            continue
        for index, entry in enumerate(entries):
            body = entry.get(inner) if isinstance(entry, Mapping) else None
            if not isinstance(body, Mapping):
                continue
            for key in body:
                where = f"{section}[{index}].{inner}.{key}"
                if key in _CODE:
                    found.append(f"{where}: {_CODE[key]}")
                elif key in _FILES or str(key).endswith(("-file", "File")):
                    found.append(
                        f"{where}: file references are refused (they read the worker's files); "
                        "inline the content (the *-data form)"
                    )
    return found

"""gitignore-style patterns, for what a working directory's package leaves out.

With the ``pathspec`` library importable, its ``GitIgnoreSpec`` matches; otherwise a small
translation of the common cases does: blank lines and ``#`` comments, ``!`` negation, a trailing
``/`` for directories only, a ``/`` at the start or in the middle anchoring the pattern to the
file's directory, ``*``, ``?``, ``[…]`` and ``**`` (leading ``**/``, trailing ``/**``, inner
``/**/``), and ``\\`` escapes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

try:  # pragma: no cover - which branch runs depends on the environment
    import pathspec as _pathspec
except ImportError:  # pragma: no cover
    _pathspec = None


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negated: bool
    dir_only: bool

    def matches(self, path: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.fullmatch(path) is not None


def _translate_glob(glob: str) -> str:
    """A gitignore glob (already without ``!``, trailing ``/`` and leading ``/``) as a regex."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        if glob.startswith("**/", i) and (i == 0 or glob[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i) and i + 2 == n and (i == 0 or glob[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[":
            start = i + 2 if glob[i + 1 : i + 2] in ("!", "^") else i + 1
            end = glob.find("]", start + 1)  # a "]" right after "[" or "[!" is literal
            if end == -1:
                out.append(re.escape("["))
                i += 1
                continue
            body = glob[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif glob[i] == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def parse_rule(line: str) -> Rule | None:
    """One line of an ignore file as a rule (None for blank lines and comments)."""
    line = line.rstrip("\n").rstrip("\r")
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(line) > len(stripped):  # "a\ " keeps its space
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated or line.startswith(("\\#", "\\!")):  # "\#", "\!": a literal # or !
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    pattern = _translate_glob(line)
    if not anchored and not line.startswith("**"):
        pattern = "(?:.*/)?" + pattern
    return Rule(re.compile(pattern, re.DOTALL), negated, dir_only)


class IgnoreFile:
    """The patterns of one ignore file, which apply to paths below the directory it is in."""

    def __init__(self, base: str, lines: Iterable[str], *, use_pathspec: bool | None = None):
        self.base = base.strip("/")
        lines = list(lines)
        use = _pathspec is not None if use_pathspec is None else use_pathspec
        self._spec: Any = _pathspec.GitIgnoreSpec.from_lines(lines) if use else None
        self._rules = [] if use else [r for r in map(parse_rule, lines) if r is not None]

    def verdict(self, path: str, is_dir: bool) -> bool | None:
        """True: ignore ``path`` (relative to the package root); False: a ``!`` rule keeps it;
        None: no pattern here is about it."""
        if self.base:
            if not path.startswith(self.base + "/"):
                return None
            path = path[len(self.base) + 1 :]
        if self._spec is not None:
            return self._spec.check_file(path + "/" if is_dir else path).include
        for rule in reversed(self._rules):
            if rule.matches(path, is_dir):
                return not rule.negated
        return None


def is_ignored(files: Iterable[IgnoreFile], path: str, is_dir: bool) -> bool:
    """Whether ``path`` is left out: the last ignore file (in the order given) with a verdict
    decides, like the last matching line within a file."""
    ignored = False
    for ignore_file in files:
        verdict = ignore_file.verdict(path, is_dir)
        if verdict is not None:
            ignored = verdict
    return ignored

"""A benchmark before and after a change, in one run: the same script at a base revision (checked
out in a temporary git worktree) and in this working tree, alternated round by round so both
see the same machine, then each figure's median before and after and their ratio.

    .venv/bin/python bench/compare.py --base <rev> [--rounds 3] admission.py --admit 10000
    .venv/bin/python bench/compare.py --base <rev> dispatch.py --jobs 50

The figures compared are the numbers a benchmark prints followed by a unit (``ms``, ``s``,
``jobs/s``, ``req/s``), named by the text before them on their line; a ratio above 1 means the
working tree takes longer (or, for ``jobs/s`` and ``req/s``, does less).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"(?P<value>\d[\d,]*(?:\.\d+)?) ?(?P<unit>ms per job|jobs/s|req/s|ms|s)\b")
HIGHER_IS_BETTER = {"jobs/s", "req/s"}


def figures(output: str) -> dict[str, tuple[float, str]]:
    """``label → (value, unit)`` for every figure the benchmark printed, labelled by the text
    before a line's first figure (the same before and after) and the figure's unit."""
    found = {}
    for line in output.splitlines():
        matches = list(FIGURE.finditer(line))
        if not matches:
            continue
        stem = re.sub(r"\s+", " ", line[: matches[0].start()].strip(" :,(") or line)[-50:]
        previous_end = matches[0].start()
        for match in matches:
            between = line[previous_end : match.start()].strip(" :,()")  # e.g. "p99"
            previous_end = match.end()
            label = " ".join(part for part in (stem, between, f"[{match['unit']}]") if part)
            found[label] = (float(match["value"].replace(",", "")), match["unit"])
    return found


def run(tree: Path, script: str, args: list[str]) -> str:
    command = [str(ROOT / ".venv/bin/python"), str(tree / "bench" / script), *args]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{tree}: {script} failed\n{done.stdout}\n{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("script", help="a benchmark under bench/, e.g. admission.py")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    base_dir = Path(tempfile.mkdtemp(prefix="manta-base-"))
    shutil.rmtree(base_dir)
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(base_dir), options.base],
        cwd=ROOT,
        check=True,
    )
    (base_dir / ".venv").symlink_to(ROOT / ".venv")  # one interpreter and set of packages
    samples: dict[str, dict[str, list[float]]] = {
        "before": defaultdict(list),
        "after": defaultdict(list),
    }
    units: dict[str, str] = {}
    try:
        for n in range(options.rounds):
            for side, tree in (("before", base_dir), ("after", ROOT)):
                output = run(tree, options.script, options.args)
                print(f"--- round {n + 1}, {side}\n{output.rstrip()}", flush=True)
                for label, (value, unit) in figures(output).items():
                    samples[side][label].append(value)
                    units[label] = unit
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_dir)], cwd=ROOT)
    print(f"\n{options.script} {' '.join(options.args)}: median of {options.rounds} rounds")
    print(f"before = {options.base}, after = this working tree")
    for label, unit in units.items():
        before, after = samples["before"].get(label), samples["after"].get(label)
        if not before or not after:
            continue
        b, a = statistics.median(before), statistics.median(after)
        ratio = (b / a if unit in HIGHER_IS_BETTER else a / b) if a and b else float("nan")
        print(f"  {label:<64} {b:>10.3f} → {a:>10.3f}   ratio {ratio:.2f}")


if __name__ == "__main__":
    main()

"""CPU per GET of three API reads through Django's test client, in this process (Python, not
PostgreSQL): a job's detail, a workspace's detail and the organisation's quota, each the best of
three rounds of ``--gets``, under the submit benchmark's settings and world (bench/submit.py).

    .venv/bin/python bench/reads.py [--gets 200]

It measures the code of the checkout it is run from (the working directory): run from a
``git worktree`` of an older commit (``cd ../old && /path/to/bench/reads.py``), it measures
that commit's, so the two can be measured alternately on the same machine, which
bench/compare.py cannot do for a script the older commit does not have.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gets", type=int, default=200)
    options = parser.parse_args()
    root = Path.cwd()
    sys.path[:0] = [str(root), str(root / "bench")]
    from submit import set_up

    _, world = set_up()
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {world['token']}")
    posted = client.post(world["path"], world["job_body"], content_type="application/json")
    assert posted.status_code == 201, posted.content
    workspace = world["path"].rsplit("/jobs/", 1)[0] + "/"
    org = workspace.split("/workspaces/")[0] + "/"
    reads = {
        "a job's detail": f"{world['path']}{posted.json()['id']}/",
        "a workspace's detail": workspace,
        "the organisation's quota": f"{org}quota/",
    }
    for name, path in reads.items():
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.status_code)
        for _ in range(30):
            client.get(path)
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            for _ in range(options.gets):
                client.get(path)
            best = min(best, (time.process_time() - started) / options.gets * 1000)
        print(f"GET {name}: {best:.2f} ms CPU")


if __name__ == "__main__":
    main()

"""The ``local`` launcher: one real, throw-away Ray cluster per attempt, on this host.

Each attempt gets its own head node plus one node per worker replica, every node a separate
``ray start --block`` process in its own session (so its process group can be signalled as one)
with its own ports and its own ``--temp-dir``. Nodes advertise exactly their spec's CPUs, GPUs
(logical: no GPU needs to be present), memory and custom resources, so a job sees the cluster
shape it asked for. The head advertises 0 CPUs by default: it only runs the entrypoint, which is
submitted with ``entrypoint_num_cpus=0``.

Every node of a cluster runs in that cluster's sandbox (``sandbox.py``: its own uid, PID,
mount, IPC, UTS and network namespaces, cgroups) unless the operator's ``sandbox`` settings say
``mode: off`` (single-user mode). In a sandbox Ray's ports live in the cluster's own network
and only the dashboard is forwarded to the host's 127.0.0.1.

Promises:

* Token authentication is always on: a fresh random token per cluster, given to every node as
  ``RAY_AUTH_MODE=token`` / ``RAY_AUTH_TOKEN`` and sent by us as ``Authorization: Bearer``.
  A request without it gets HTTP 401 from the dashboard.
* Nodes do not inherit this service's environment (database URLs, secret keys), only a short
  allow-list (PATH, HOME, locale, ...) plus what Ray needs, so the job's code cannot read them.
* Clusters side by side never share a port, a temp dir or a process group, and nothing here
  ever runs ``ray stop`` (which would kill every Ray process on the host).
* The handle is plain JSON and self-sufficient: every method of the launcher works from any
  process on this host, e.g. a Celery worker that replaced the one that launched. Processes
  are only signalled once ``/proc`` shows they are this cluster's, so a stale handle cannot
  kill a stranger that reused a pid.
* ``stop`` is idempotent, never raises, and leaves no process and no temp dir behind.

Not promised: ``min_replicas``/``max_replicas`` (no autoscaling; ``replicas`` nodes are started)
and ``image`` (nodes run this host's Python and Ray). Without a sandbox, Ray replaces
``--node-ip-address=127.0.0.1`` with the host's address, so GCS and raylets listen beyond
loopback: only the token guards them.

Idempotency across a crash: the caller stores the handle ``start_cluster()`` returns before it
calls ``submit()``, which is safe to repeat (Ray refuses a second job with the same
``submission_id`` and :func:`..ray_jobs.submit_idempotent` adopts the existing one, so the
entrypoint never runs twice). A caller killed after ``start_cluster()`` but before it stored
the handle is covered too: every cluster writes its handle to ``handle.json`` (mode 0600) in its
dir, ``start_cluster()`` adopts the running cluster of the same submission_id under the same
``work_dir`` instead of starting a second one, and ``find_clusters()`` lists every cluster for
sweeping those no attempt owns. Concurrent calls for one submission are not serialized here;
the caller's row lock must prevent them.

Settings read from ``request.target_config`` (all optional):

* ``work_dir``: where per-cluster dirs go (default: the system temp dir). Keep it short: Ray
  puts unix sockets under it and socket paths must stay under 108 bytes.
* ``start_timeout_seconds`` (120): how long all nodes may take to come up.
* ``stop_grace_seconds`` (3): SIGTERM-to-SIGKILL delay when stopping.
* ``object_store_memory_bytes``: plasma store size per node (default: 30% of its memory).
* ``sandbox``: the operator's :class:`.sandbox.SandboxSettings` (never a tenant's: the service
  sets it over whatever a target config holds).

The parts: ``launcher.py`` (the contract's methods), ``startup.py`` (bringing a cluster up),
``nodes.py`` (one node: start, liveness, restart), ``processes.py`` (finding, reaping and ending
a cluster's processes), ``ports.py``, ``handles.py`` (``handle.json``), ``logs.py`` (node and
driver logs on disk), ``isolation.py`` (the operator's settings, what the host can do),
``sandbox.py`` with ``sandbox_init.py`` (its PID 1, run as a script by path), ``cgroups.py`` and
``leases.py`` (uids and GPUs of live clusters).
"""

from .handles import CLUSTER_DIR_PREFIX, HANDLE_FILE, KIND, discover_handles
from .launcher import LocalRayLauncher

__all__ = ["CLUSTER_DIR_PREFIX", "HANDLE_FILE", "KIND", "LocalRayLauncher", "discover_handles"]

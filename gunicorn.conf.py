"""gunicorn's settings for the API. gunicorn reads ``./gunicorn.conf.py`` by default, so
``gunicorn config.wsgi`` from the repository (the Dockerfile, compose, ``make serve``, the
end-to-end tests) picks this up without a flag.

Metrics: every gunicorn worker counts the requests and events it serves in its own files under
one folder (prometheus-client's multiprocess mode, ``config/multiprocess.py``), emptied when the
master starts; a scrape answered by any worker adds up all of them. When a worker exits, its
live-process gauges are dropped (``mark_process_dead``); its counters stay in the sum.
"""

from config import multiprocess

multiprocess.prepare("api")  # before any worker imports prometheus_client


def child_exit(server, worker):
    from prometheus_client import multiprocess as prometheus_multiprocess

    prometheus_multiprocess.mark_process_dead(worker.pid)

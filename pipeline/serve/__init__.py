"""``faultwatch serve``: Prometheus metrics, a Burrow-shaped JSON API, a live page and a health check
over the Delta tables, read with deltalake (no Spark) and refreshed in the background.

:mod:`follow` reads tables incrementally, :mod:`state` turns their views into one state (pure),
:mod:`metrics`, :mod:`api` and :mod:`page` render it, :mod:`snapshot` refreshes it, :mod:`worker`
does that in a child process, :mod:`app` answers requests from the result, over uvicorn (:mod:`asgi`).
"""

from pipeline.serve.app import Server

__all__ = ["Server"]

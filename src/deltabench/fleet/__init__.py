"""The fleet: jobs submitted through the dashboard or the API, run by workers, their results posted back.

The process tree (the runners' own processes, under ``runners/``, are drawn in runners/__init__.py):

    deltabench serve                       the web app (web/) and the store (db/)
    └── local worker thread (dispatch.py)  claims queued jobs from the store, or
        Celery worker (fleet.py)           a GPU host's ``deltabench worker``, one queue per device kind
        └── python -m deltabench.fleet.worker   one run of one submitted job (worker.py), which
            └── the runners' job processes      gate, then time, each job in fresh processes (runners/)

The fleet sits above the runners and the store: the runners never import the store, and a GPU host's worker
posts its result documents over HTTP rather than opening the database.
"""

"""deltabench: verify and benchmark delta-rule sequence-mixer kernels against float64 oracles.

The folders are the layers, each importing only those below it (import-linter's ``layers`` contract in
pyproject.toml holds the order; ``lint-imports`` checks it):

    cli           the ``deltabench`` command: one module per command
    web           the dashboard and the HTTP API
    fleet         job dispatch, the Celery worker, the fleet's configuration
    runners | db  running one job in fresh processes  |  the results store
    correctness | regression   the correctness gate before any timing  |  the regression gate's statistics
    harness       the core: ops, impls, cases, devices, result documents, suites
    kernels       deltabench's own kernels and the adapters of other packages'
    references    the float64 oracles and the op contracts

``suites/`` holds the shipped suite files. The public API for kernel authors is
``from deltabench.harness import register_impl, register_op``.
"""

"""One router per resource: runs, results, history, compare, jobs, fleet (workers, machines), regressions."""

__all__ = ["compare", "fleet", "history", "jobs", "regressions", "results", "runs"]

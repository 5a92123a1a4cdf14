"""Server-rendered pages (Jinja2, autoescaped): runs, a run's tables, comparisons, history, jobs, regressions."""

__all__ = ["render", "routes"]

"""Assembles the resource routers into the ``/api/v1`` router."""

from __future__ import annotations

from fastapi import APIRouter

from .routes import compare, fleet, history, jobs, regressions, results, run_deletion, runs

__all__ = ["API_PREFIX", "api_router"]

API_PREFIX = "/api/v1"

api_router = APIRouter(prefix=API_PREFIX)
for _module in (runs, run_deletion, results, history, compare, jobs, fleet, regressions):
    api_router.include_router(_module.router)

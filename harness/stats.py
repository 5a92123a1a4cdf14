"""The former home of regression detection, kept as an import path: everything lives in
:mod:`deltabench.harness.regression` (sample statistics, noise model, grading rule, matching, rendering)."""

from __future__ import annotations

from .regression import *  # noqa: F403
from .regression import __all__  # noqa: F401

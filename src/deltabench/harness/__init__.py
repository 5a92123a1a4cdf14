"""The domain core: op contracts, the impl registry, cases, verification, statistics and the CLI.

Public API::

    from deltabench.harness import register_op, register_impl, register_impls, get_impl, get_op, Case
"""

from .cases import Case, parse_dtype, parse_shape
from .errors import BadInput, DeltabenchError, ImplUnavailable, UnknownImpl, UnknownOp
from .ops import OPS, get_op, register_op
from .registry import Impl, all_impls, get_impl, impls_for, load_module, register_impl, register_impls

__all__ = [
    "OPS",
    "BadInput",
    "Case",
    "DeltabenchError",
    "Impl",
    "ImplUnavailable",
    "UnknownImpl",
    "UnknownOp",
    "all_impls",
    "get_impl",
    "get_op",
    "impls_for",
    "load_module",
    "parse_dtype",
    "parse_shape",
    "register_impl",
    "register_impls",
    "register_op",
]

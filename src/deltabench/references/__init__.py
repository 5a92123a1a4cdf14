"""Float64 oracles and seeded input generators, one module per op (gdn, gdn2, gdn_layer, kda, lm_step, sdm).

Pure functions of their inputs: nothing here imports the rest of deltabench. Each public module but ``contract``
is a built-in op of that name and declares its ``CONTRACT``: adding ``references/<op>.py`` adds the op.
"""

import pkgutil as _pkgutil

from ._inputs import REGIMES
from .gdn import gdn_recurrent
from .gdn2 import gdn2_recurrent
from .kda import kda_recurrent
from .sdm import sdm_recurrent

__all__ = ["REGIMES", "builtin_op_modules", "gdn2_recurrent", "gdn_recurrent", "kda_recurrent", "sdm_recurrent"]


def builtin_op_modules() -> tuple[str, ...]:
    """The built-in ops, by name: the modules of this package, less ``contract`` and the private ones, in name
    order (listed without importing them)."""
    return tuple(
        m.name
        for m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name)
        if not m.ispkg and not m.name.startswith("_") and m.name != "contract"
    )

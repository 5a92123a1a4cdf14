"""Float64 oracles and seeded input generators, one module per op (gdn, gdn2, kda, sdm).

Pure functions of their inputs: nothing here imports the rest of deltabench.
"""

from ._inputs import REGIMES
from .gdn import gdn_recurrent
from .gdn2 import gdn2_recurrent
from .kda import kda_recurrent
from .sdm import sdm_recurrent

__all__ = ["REGIMES", "gdn2_recurrent", "gdn_recurrent", "kda_recurrent", "sdm_recurrent"]

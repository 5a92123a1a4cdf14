"""How a case's dims are stored: the delta family's B, T, H, K, V in indexed columns of their own, any other dim of an
op in ``results.extra_dims`` (migration 0006). The one mapping between a case's dims and the columns.

``extra_dims`` is canonical JSON text (keys sorted, no spaces; ``""`` when there are none), so that a shape is found
by plain string equality in SQLite and PostgreSQL alike; an indexed dim the op lacks is stored as 0 (a real dim is
at least 1).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from deltabench.harness.document import CaseSpec
from deltabench.references.contract import INDEXED_DIMS, order_dims

__all__ = ["ABSENT", "PACKED_DIM", "case_dim_fields", "dims_columns", "dims_of", "extra_dims_text", "stored_dims"]

ABSENT = 0  # an indexed dim the op does not have
# A packed case's count of sequences: a stored dim of every op, beside its contract's dims
PACKED_DIM = "N"


def extra_dims_text(extra: Mapping[str, int] | None) -> str:
    """The stored form of the dims besides B, T, H, K, V: ``{"D":8}`` sorted and compact, ``""`` for none."""
    if not extra:
        return ""
    return json.dumps({d: int(extra[d]) for d in sorted(extra)}, separators=(",", ":"))


def dims_columns(dims: Mapping[str, int]) -> dict[str, Any]:
    """The column values of a case's `dims` (any names): B..V (0 where absent) and ``extra_dims``."""
    values: dict[str, Any] = {d: int(dims.get(d) or ABSENT) for d in INDEXED_DIMS}
    values["extra_dims"] = extra_dims_text({d: v for d, v in dims.items() if d not in INDEXED_DIMS})
    return values


def stored_dims(case: CaseSpec) -> dict[str, int]:
    """The dims a document's case (harness.document.CaseSpec) is stored under: its dims, and for packed sequences
    their count as the extra dim ``N`` (so that a packed job's series is not its dense shape's, and its stored
    shape id reads ``B1-T300-H2-K32-V32-N4`` as the case's does)."""
    packed = {} if case.seqlens is None else {PACKED_DIM: len(case.seqlens)}
    return {**case.dims, **packed}


def dims_of(B: int, T: int, H: int, K: int, V: int, extra_dims: str | None) -> dict[str, int]:
    """A stored row's dims back as ``{dim: size}`` (references/contract.order_dims' order)."""
    dims = {d: v for d, v in zip(INDEXED_DIMS, (B, T, H, K, V), strict=True) if v and v != ABSENT}
    if extra_dims:
        dims.update(json.loads(extra_dims))
    return order_dims(dims)


def case_dim_fields(B: int, T: int, H: int, K: int, V: int, extra_dims: str | None) -> dict[str, Any]:
    """A stored row's dims as CaseSpec's fields: B..V (None where the op lacks one) and ``extra_dims``."""
    fields: dict[str, Any] = {
        d: (v if v != ABSENT else None) for d, v in zip(INDEXED_DIMS, (B, T, H, K, V), strict=True)
    }
    fields["extra_dims"] = json.loads(extra_dims) if extra_dims else {}
    return fields

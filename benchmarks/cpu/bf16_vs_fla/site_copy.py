"""triton_chunk's arithmetic with each bf16 rounding site behind its own switch (the rounding study).

:func:`build` copies kernels/gdn/triton's chunk kernels (chunk.py, wy.py, state.py, local_bwd.py) and
kernels/common/triton/mma.py into a temporary package, replacing the target dtype of every cast to the inputs' 16-bit
dtype with a per-site constant: bf16 while the site is on, fp32 once it is named in `off`. The copy runs on fp32
tensors holding bf16 values (:func:`gdn_sites`), so a site left on rounds exactly as triton_chunk does at bf16
and a site switched off keeps fp32. Every cast is claimed by exactly one site (the build fails otherwise), and
with every site on the copy reproduces triton_chunk's bf16 results (checked by grad_errors.py ``--check-sites``).

Sites (where triton_chunk rounds to bf16):
    L       wy.py: (I + A)^-1 rounded for the W and U products      WU      wy.py: W and U stored
    XY      wy.py: beta*gamma*k and beta*v                         h       state.py: the chunk states S (used, stored)
    vnew    state.py: v_new (used, stored)                         M       state.py: the output's intra-chunk matrix
    kdec_f  state.py: k*exp(G_C - G) in the state update           dh      state.py bwd: dH (used, stored)
    kdec_b  state.py bwd: k*exp(G_C - G)                           MT      state.py bwd: M^T
    dvnew   state.py bwd: dv_new (used, stored)                    qg      state.py bwd: scale*gamma*q
    khat    local_bwd.py: gamma*k                                  Z       local_bwd.py: v - K^ S
    Pm      local_bwd.py: the masked do v_new^T (and transpose)    dw      local_bwd.py: dv_new S^T
    dkk     local_bwd.py: dA-weighted k k^T factors                TT      local_bwd.py: T^T for dv
"""

from __future__ import annotations

import importlib
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["SITES", "build", "gdn_sites"]

ROOT = Path(__file__).resolve().parents[3]
# (file, site, regex on the source); the kernel a pattern must fall in is implied by the pattern itself, except
# kdec (the same expression in state_fwd_kernel and the backward walk's step), split on the step's definition.
_RULES: list[tuple[str, str, str]] = [
    ("wy.py", "L", r"\b(l[0-3])\.to\(dt\)"),
    ("wy.py", "WU", r"\b([wu]a)\.to\([wu]\.dtype\.element_ty\)"),
    ("wy.py", "XY", r"^(\s+[xy][0-3] = .*)\.to\(dt\)$"),
    ("state.py", "h", r"\b(S)\.to\(dt\)"),
    ("state.py", "vnew", r"\b(vn)\.to\(dt\)"),
    ("state.py", "M", r"\b(M)\.to\(dt\)"),
    ("state.py", "dh", r"\b(dH)\.to\(dt\)"),
    ("state.py", "MT", r"\b(MT)\.to\(dt\)"),
    ("state.py", "dvnew", r"\b(dvn)\.to\(dt\)"),
    ("state.py", "qg", r"^(\s+qg = .*)\.to\(dt\)$"),
    ("local_bwd.py", "khat", r"^(\s+khat = .*)\.to\(dt\)$"),
    ("local_bwd.py", "Z", r"\b(Z)\.to\(dt\)"),
    ("local_bwd.py", "Pm", r"\b(PmaskT?)\.to\(dt\)"),
    ("local_bwd.py", "dw", r"\b(dw_acc)\.to\(dt\)"),
    ("local_bwd.py", "dkk", r"^(\s+dkkT? = .*)\.to\(dt\)$"),
    ("local_bwd.py", "TT", r"\b(TT)\.to\(dt\)"),
]
SITES = ("L", "WU", "XY", "h", "vnew", "M", "kdec_f", "dh", "kdec_b", "MT", "dvnew", "qg", "khat", "Z", "Pm")
SITES += ("dw", "dkk", "TT")
_KDEC = r"^(\s+kdec = .*)\.to\(dt\)$"


def _header(sites: set[str], off: set[str]) -> str:
    lines = [f"RS_{s} = tl.constexpr(tl.float32 if {s in off} else tl.bfloat16)" for s in sorted(sites)]
    return "\n".join(lines)


def _rewrite(name: str, src: str, off: set[str]) -> str:
    used: set[str] = set()
    for fname, site, pattern in _RULES:
        if fname != name:
            continue
        src, n = re.subn(pattern, rf"\1.to(RS_{site})", src, flags=re.M)
        if n == 0:
            raise RuntimeError(f"site {site}: no cast matches {pattern!r} in {name}")
        used.add(site)
    if name == "state.py":
        fwd, bwd = src.split("def _bwd_step", 1)
        fwd, nf = re.subn(_KDEC, r"\1.to(RS_kdec_f)", fwd, flags=re.M)
        bwd, nb = re.subn(_KDEC, r"\1.to(RS_kdec_b)", bwd, flags=re.M)
        if (nf, nb) != (1, 1):
            raise RuntimeError("kdec: expected one cast in each walk")
        src = fwd + "def _bwd_step" + bwd
        used |= {"kdec_f", "kdec_b"}
    left = re.findall(r".*\.to\((?:dt|[a-z]+\.dtype\.element_ty)\).*", src)
    stores_of_outputs = [line for line in left if re.search(r"\b(o|dq|dk|dv)\.dtype", line)]
    if len(left) != len(stores_of_outputs):
        raise RuntimeError(f"{name}: casts no site claims: {[x.strip() for x in left if x not in stores_of_outputs]}")
    anchor = "import triton.language as tl\n"
    return src.replace(anchor, anchor + _header(used, off) + "\n", 1)


def build(off: set[str] | frozenset[str] = frozenset()) -> ModuleType:
    """Write the site-switched copy (sites in `off` kept in fp32) and import its chunk module."""
    unknown = set(off) - set(SITES)
    if unknown:
        raise ValueError(f"unknown sites {sorted(unknown)}; known: {', '.join(SITES)}")
    pkg = Path(tempfile.mkdtemp(prefix="gdn_sites_")) / "gdn_sites"
    # The kernels' own layout (gdn/triton/, common/triton/), so that their relative imports resolve in the copy.
    (pkg / "gdn" / "triton").mkdir(parents=True)
    (pkg / "common" / "triton").mkdir(parents=True)
    for d in (pkg, pkg / "gdn", pkg / "gdn" / "triton", pkg / "common", pkg / "common" / "triton"):
        (d / "__init__.py").write_text("")
    (pkg / "common" / "triton" / "mma.py").write_text((ROOT / "kernels/common/triton/mma.py").read_text())
    for name in ("chunk.py", "walk.py", "wy.py", "state.py", "local_bwd.py"):
        src = (ROOT / "kernels/gdn/triton" / name).read_text()
        as_is = name in ("chunk.py", "walk.py")  # chunk.py orchestrates; walk.py only serves the split forward
        (pkg / "gdn" / "triton" / name).write_text(src if as_is else _rewrite(name, src, set(off)))
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("gdn_sites.gdn.triton.chunk")


def gdn_sites(chunk: ModuleType):  # type: ignore[no-untyped-def]
    """A gdn impl running the copy `chunk` (from :func:`build`) on fp32 views of the inputs; o returned in v's
    dtype, gradients cast back to each input's dtype by autograd (as triton_chunk stores them)."""

    def impl(q, k, v, g, beta, scale=None, initial_state=None):  # type: ignore[no-untyped-def]
        f = torch.float32
        o, ht = chunk.chunk_gated_delta_rule(q.to(f), k.to(f), v.to(f), g, beta.to(f), scale, initial_state, True)
        return o.to(v.dtype), ht

    return impl

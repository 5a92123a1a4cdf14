"""Adapters that give third-party kernels deltabench's op signatures, so the same gate judges them.

Each module imports without its package installed (the package is imported on the first call) and holds plain
functions with an op's signature, ``fn(q, k, v, *gates, scale=None, initial_state=None) -> (o, final_state)``:

* :mod:`.fla`: flash-linear-attention 0.6.0's Triton path (``gdn_fla_chunk``, ``gdn_fla_recurrent``,
  ``gdn2_fla_chunk``, ``kda_fla_chunk``), with FlashQLA/TileLang dispatch off and FLA's #640 backward guard bypassed
  on Hopper (recorded in ``fla.run_notes()``);
* :mod:`.flash_qla`: FlashQLA's fused TileLang kernels (``gdn_flash_qla``; SM90+, bf16/fp16, K = V = 128);
* :mod:`.opengdn`: opengdn 0.1.0 (``gdn_opengdn_triton``, ``gdn_opengdn_chunkwise``).

They are wired into the registry by ``harness/builtin.py`` with ``requires=(package,)``, so `deltabench list` shows
each one as unavailable, with the reason, where its package is missing.
"""

__all__ = ["fla", "flash_qla", "opengdn"]

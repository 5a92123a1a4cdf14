"""deltabench's Pallas kernels for GDN-2 (and KDA through them): a fused chunked forward written for the TPU, and
its backward in JAX from the forward's residuals. See :mod:`.chunk`."""

from .chunk import chunk_gdn2_pallas, chunk_kda_pallas, gdn2_pallas_chunk, kda_pallas_chunk

__all__ = ["chunk_gdn2_pallas", "chunk_kda_pallas", "gdn2_pallas_chunk", "kda_pallas_chunk"]

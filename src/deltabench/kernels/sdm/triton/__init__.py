"""SDM in Triton: :mod:`.triton_chunk` and :mod:`.triton_chunk_bwd` (deterministic forward and backward) and
:mod:`.pk_topk_triton` (product-key top-k); importing this package needs no Triton."""

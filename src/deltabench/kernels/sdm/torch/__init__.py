"""SDM in PyTorch: :mod:`.torch_recurrent` (token-serial), :mod:`.torch_chunk` (chunked WY form), :mod:`.decode`
(one token) and :mod:`.pk_topk` (product-key top-k)."""

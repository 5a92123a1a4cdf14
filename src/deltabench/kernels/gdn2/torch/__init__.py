"""GDN-2 in PyTorch: :mod:`.torch_recurrent` (token-serial, the readable version) and :mod:`.torch_chunk` (chunked)."""

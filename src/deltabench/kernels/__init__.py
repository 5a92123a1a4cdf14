"""deltabench's kernels: implementations of the delta-rule ops, one folder per op.

- :mod:`.gdn`, :mod:`.gdn2`, :mod:`.kda`, :mod:`.sdm`: one file per algorithm (``torch_recurrent``,
  ``torch_chunk``, and the Triton/JAX ones beside them);
- :mod:`.gdn_layer`: the GatedDeltaNet mixer block around a gdn impl's recurrence;
- :mod:`.lm_step`: a small LM's training step around a gdn, gdn2 or kda impl;
- :mod:`.common`: stages shared across ops;
- :mod:`.external`: adapters for third-party packages.

Usable on their own, like FLA's ops: nothing here imports the harness, db or web, and importing this package
imports no op (each subpackage is imported when asked for).
"""

__all__ = ["common", "external", "gdn", "gdn2", "gdn_layer", "kda", "lm_step", "sdm"]

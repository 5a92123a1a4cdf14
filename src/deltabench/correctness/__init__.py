"""The correctness gate: is an impl right for a case, before anything of it is timed?

Its modules, bottom to top (each imports only those above it in this list):

    checks, tolerances       one comparison as a CheckRecord; the bound of each check, dtype and regime
    calls                    an impl called on drawn inputs, outputs and gradients read back (Run, Variant, Item)
    plan                     which shapes, regimes, variants and lengths a gate runs; where the oracle stops
    reference_cache          reference runs shared between impls gated on the same draws, on disk
    oracle                   the float64 oracle (stacked along B) and the fp32 chunked reference
    fresh_process            a call replayed in a new interpreter (determinism across processes)
    properties               closeness, inputs unchanged, streaming, determinism: each as records
    gate_memo                reduced-case records reused across one run's jobs
    engine                   verify_case: the gate itself, a VerifyReport
    memory_need, verify_child, compile_ahead   the CLI's and runners' use of it: memory, a child process, compiles

The entry point is :func:`deltabench.correctness.engine.verify_case`.
"""

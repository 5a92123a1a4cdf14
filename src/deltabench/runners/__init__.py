"""The runners: one run of a suite, each job gated, then timed, in fresh processes, into one result document.

The process tree of ``deltabench run`` (the fleet's workers start the same tree: fleet/__init__.py):

    deltabench run                        plans the run and writes the document after every job (session.py)
    ├── gate processes, N at once         ``--gate-workers N``: each job's correctness gate (isolated.run_gates)
    ├── compile processes                 an impl that compiles per shape: its gates' shapes built side by side
    └── a worker process per impl         its jobs one after another: first call, memory, timing (job.py);
                                          ``isolation = "job"``: a process per job instead (isolated.py)

``interleave.py`` runs two source trees' jobs alternately (``deltabench run --base-ref``), and ``replay.py`` replays
its ``--repeat auto`` stopping rule on recorded runs (the gate's calibration); ``timing.py`` holds the
timers (CPU clocks, CUDA events and graphs, JAX), ``memory.py`` the peak-memory probe, ``environment.py`` what a
document records of the machine and the software. The runners never import the store (db/): results leave a run as
documents.
"""

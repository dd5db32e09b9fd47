"""Where and how a run computes: machine facts (GPUs, CPU features, probed in a subprocess for the app), the
device rules (what this machine can run, what `auto` picks), the parallel strategy (none, DataParallel, DDP, Horovod)
and the precision (autocast, GradScaler, the optimizer step).

May import `core`, `data` and `model`.
"""

"""Training: optimizers and losses, statistics, the reporter (events, log, TensorBoard), the parts of a run,
the loop, the pre-flight, the engine (one worker's run) and the learning-rate finder.

May import everything below: `core`, `data`, `model`, `device`, `deploy`.
"""

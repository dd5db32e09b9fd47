"""A stand-in for Horovod in the tests (the real one needs a compiler and MPI to install).

It offers the calls TrainDeck makes (`horovod.torch` and the `horovodrun` launcher module), built on
torch.distributed with gloo, so the wiring of the Horovod strategy runs for real: separate processes,
gradients averaged by the optimizer, parameters and optimizer state broadcast from rank 0. Every call is
appended to $HOROVOD_STANDIN_LOG, so a test can see what was called.
"""

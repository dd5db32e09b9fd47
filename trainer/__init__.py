"""TrainDeck's trainer: the headless half (config, data, models, the loop, runs, hosts). Torch is imported lazily."""

__version__ = "0.1.0"

from trainer.core import lazy_dynamo  # noqa: E402 - before any module of the trainer imports torch

lazy_dynamo.install()

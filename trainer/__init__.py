"""TrainDeck's trainer: the headless half (config, data, models, the loop, runs, hosts). Torch is imported lazily."""

__version__ = "0.1.0"

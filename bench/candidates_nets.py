"""Variants of the built-in networks that bench/candidates.py measured and Auto did not take."""

from trainer.model.models import ResNet9


class ResNet9W24(ResNet9):
    """resnet9 at width 24 (1.09 M parameters, 0.145 GMACs at 96 px) where the built-in has 16."""

    def __init__(self, num_classes: int = 10):
        super().__init__(num_classes, width=24)

"""train.budget on the trainer's clock: when training must end, and what a resumed run goes on from.

The budget counts from the process's start (`started`; a resumed run's clock is moved back by what its earlier
segments spent). train.finish_images keeps time at its end for the test set and the exports, at the validation speed
measured (before the first validation, a third of the training time per image: a forward pass of a training step's
three passes), so training ends early enough for the whole job to fit.
"""

from __future__ import annotations

import logging
import math
import statistics

from trainer.core import clock
from trainer.core.config import TrainConfig
from trainer.core.schedule import Stretch

log = logging.getLogger("trainer")


class Budget:
    def __init__(self, train: TrainConfig, started: float | None = None):
        self.train = train
        self.started = clock.now() if started is None else started  # train.budget counts from here
        self.trained_before_s = 0.0  # what the run's earlier segments trained (resumed from a checkpoint)
        self.fit_started = clock.now()  # this segment's training began
        self.eval_s_per_image: tuple[float, ...] = ()  # each validation's seconds per image (train.finish_images)
        self.train_s_per_image = 0.0  # training's, at the last step

    def left(self) -> float:
        """Seconds of train.budget left for training (infinite without one): the time kept for what comes after
        training is not training's."""
        return self.ends() - clock.now() if self.train.budget else math.inf

    def ends(self) -> float:
        """When training must end on the trainer's clock: the budget's end less the time kept after it."""
        return self.started + self.train.budget * 60 - self.kept_s()

    def kept_s(self) -> float:
        """The seconds train.finish_images keeps for after training: at the median of this launch's validations (the
        first's warm-up left out once there are others); before the first, a third of training's time per image."""
        measured = self.eval_s_per_image[1:] or self.eval_s_per_image
        per_image = statistics.median(measured) if measured else self.train_s_per_image / 3
        return self.train.finish_images * per_image

    def validated(self, seconds: float, images: int) -> None:
        """A validation of `images` images took `seconds`."""
        self.eval_s_per_image += (seconds / max(1, images),)

    def trained(self) -> float:
        """Seconds trained, this segment's and the earlier ones'."""
        return clock.now() - self.fit_started + self.trained_before_s

    def saved(self, epochs: int, stretch: Stretch) -> dict | None:
        """What a resumed run goes on from (its checkpoint keeps it): the budget's seconds spent and trained, the
        epochs as re-planned and the schedule's clock (train.replan's re-stretch)."""
        if not self.train.budget:
            return None
        return {"spent_s": round(clock.now() - self.started, 3), "trained_s": round(self.trained(), 3),
                "epochs": epochs, "stretch": {"total": stretch.total, "origin_step": stretch.origin_step,
                                              "origin_virtual": stretch.origin_virtual, "end_step": stretch.end_step}}

    def go_on_from(self, saved: dict | None, stretch: Stretch) -> int | None:
        """A resumed run spends what its earlier segments left, not a new budget: the clock moved back by what they
        spent; with train.replan, the schedule's clock where they left it (the learning rate goes on from where it
        was, annealing by the same end). The epochs they planned, to go on with (None: keep the config's)."""
        if not self.train.budget or not saved:
            return None
        self.started -= float(saved["spent_s"])
        self.trained_before_s = float(saved.get("trained_s", 0.0))
        kept = saved.get("stretch") or {}
        epochs = None
        if self.train.replan and kept.get("total") == stretch.total:
            epochs = int(saved["epochs"])
            stretch.origin_step, stretch.origin_virtual, stretch.end_step = (kept["origin_step"],
                                                                             kept["origin_virtual"], kept["end_step"])
        log.info("train.budget: %.0f s spent by the earlier segments, %.0f s left; %d epochs planned",
                 float(saved["spent_s"]), self.left(), epochs or self.train.epochs)
        return epochs

"""How many epochs a run under train.budget trains, asked by the loop after each epoch.

train.replan plans the epochs that fit in the budget left from the epochs measured; after the first epoch,
train.min_epochs and train.recheck_epochs end a run whose network Auto should change (it "makes way"); early stopping
mid-schedule anneals the learning rate first. Each decision changes `cfg.train.epochs` and the schedule's clock
(`Stretch`), and a `replan` event says old -> new and why.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable

from trainer.core.config import EarlyStopConfig, RunConfig
from trainer.core.schedule import Stretch
from trainer.model.checkpoint import TrainState
from trainer.train.budget import Budget

log = logging.getLogger("trainer")

REPLAN_WINDOW = 10  # recent epochs whose mean time train.replan plans from
REPLAN_GROWTH = 1.1  # more epochs are planned only when more than this many times as many (+1) fit
REPLAN_MARGIN = 0.95  # share of the budget left that the re-planned epochs may fill
ANNEALED_SHARE = 0.9  # past this share of a budget's schedule the learning rate is annealed (one-cycle: < 6% of peak)
MAX_EPOCHS = 100000  # train.epochs' own limit


class EpochPlan:
    def __init__(self, cfg: RunConfig, budget: Budget, stretch: Stretch, steps_per_epoch: int, reporter,
                 world_size: int = 1, write_status: Callable[..., None] | None = None):
        self.cfg, self.budget, self.stretch, self.steps_per_epoch = cfg, budget, stretch, steps_per_epoch
        self.reporter, self.world_size, self.write_status = reporter, world_size, write_status
        self.epoch_seconds: list[float] = []  # this launch's epochs, as measured
        self.out_of_budget = False  # the run ended because train.budget was spent
        # why the run ended after its first epoch to make way for another network, when it did: {"reason": too_slow
        # (train.min_epochs) or too_fast (train.recheck_epochs), "why": in words, "fit_epochs"}
        self.made_way: dict = {}
        self.annealing_to_stop = False  # early stopping's patience ran out mid-schedule: the run anneals, then ends

    @property
    def replanning(self) -> bool:
        return bool(self.cfg.train.replan and self.cfg.train.budget)

    def _planned(self, epochs: int) -> None:
        self.cfg.train.epochs = self.reporter.epochs = epochs
        if self.write_status is not None:
            self.write_status(epochs=epochs)

    def anneal_before_stopping(self, st: TrainState) -> bool:
        """Early stopping under a budget's schedule (`train.budget` and `train.replan`, one process): when its patience
        runs out while the learning rate is still far from annealed, stopping there would keep the weights of a high
        rate. The run anneals first: the schedule goes to its end over the next third of the patience (at least one
        epoch, within the epochs planned), and the run ends there, early stopped (a `replan` event says so). True while
        those epochs are to come; False when the schedule is annealed already (the run stops now)."""
        cfg, stretch = self.cfg, self.stretch
        if self.annealing_to_stop:
            return st.epoch < cfg.train.epochs
        if stretch.deadline is None or st.epoch >= cfg.train.epochs:
            return False
        if stretch.virtual(st.step) >= ANNEALED_SHARE * stretch.total:
            return False
        es = cfg.train.early_stop
        patience = patience_of(es, cfg.train.epochs)
        old, epochs = cfg.train.epochs, min(cfg.train.epochs, st.epoch + max(1, math.ceil(patience / 3)))
        self.annealing_to_stop = True
        stretch.finish_by(st.step, epochs * self.steps_per_epoch)
        why = (f"early stopping: {es.metric} has not improved for {patience} epochs, with the learning rate not yet "
               f"annealed; it anneals over {epochs - st.epoch} more epoch{'s' if epochs - st.epoch > 1 else ''}, then "
               f"the run ends")
        self.reporter.emit("replan", epoch=st.epoch, old_epochs=old, epochs=epochs,
                           epoch_s=round(statistics.fmean(self.epoch_seconds or [0.0]), 3),
                           budget_left_s=round(self.budget.left(), 1), why=why)
        log.info("%s", why)
        self._planned(epochs)
        return True

    def replan(self, st: TrainState) -> None:
        """train.replan: the epochs that fit in the budget left, from the mean time of the recent epochs (the first
        epoch of a launch, with its warm-up and cache building, only while it is the one measured; a mean, so the
        epochs that also write a checkpoint count); the schedule re-stretched to end there. Fewer epochs are planned
        as soon as they no longer fit, more only when clearly more fit (no re-plan on every epoch's noise). A
        `replan` event says old -> new and why. No time for a whole epoch: in one process a last one that the budget
        cuts short (the deadline anneals its schedule); across ranks the run ends here, as its budget would."""
        cfg, left = self.cfg, self.budget.left()
        measured = self.epoch_seconds[1:] or self.epoch_seconds
        estimate = statistics.fmean(measured[-REPLAN_WINDOW:])
        epochs = max(st.epoch, min(MAX_EPOCHS, st.epoch + int(left * REPLAN_MARGIN // estimate)))
        if epochs == st.epoch and self.stretch.deadline is not None and left > 0:
            # no whole epoch fits: one more, cut short by the budget, on a schedule the deadline anneals (ending the
            # run here would leave its learning rate mid-way, planned for an epoch the machine turned out too slow for)
            epochs = st.epoch + 1
        old = cfg.train.epochs
        if st.epoch == 1 and st.step == self.steps_per_epoch and self.world_size == 1 and self._make_way(epochs, left,
                                                                                                         estimate):
            self.reporter.emit("replan", epoch=st.epoch, old_epochs=old, epochs=st.epoch, epoch_s=round(estimate, 3),
                               budget_left_s=round(left, 1), why=self.made_way["why"] + ": the run ends here")
            log.info("train.%s: %s; the run ends after its first epoch",
                     "min_epochs" if self.made_way["reason"] == "too_slow" else "recheck_epochs", self.made_way["why"])
            return
        if epochs == old or (st.epoch < old < epochs <= old * REPLAN_GROWTH + 1):
            return  # (no re-plan on noise while the plan has epochs left; at its end any that fit are planned)
        self.stretch.restretch(st.step, epochs * self.steps_per_epoch)
        why = (f"{estimate:.3g} s per epoch measured, {left:.0f} s of the budget left: "
               + ("faster than planned" if epochs > old else "slower than planned"))
        self.reporter.emit("replan", epoch=st.epoch, old_epochs=old, epochs=epochs, epoch_s=round(estimate, 3),
                           budget_left_s=round(left, 1), kept_s=round(self.budget.kept_s(), 1), why=why)
        log.info("train.replan: %d -> %d epochs (%s)", old, epochs, why)
        if epochs == st.epoch:
            self.out_of_budget = True  # the budget ends the run here, as it would at the next epoch's start
        self._planned(epochs)

    def _make_way(self, epochs: int, left: float, estimate: float) -> bool:
        """After a launch's first epoch: whether the run ends to make way for another network, far slower
        (train.min_epochs) or faster (train.recheck_epochs) than the probe measured; `made_way` says why."""
        train = self.cfg.train
        fit = f"{epochs} epochs fit in the {left:.0f} s of the budget left at {estimate:.3g} s per epoch"
        if epochs < train.min_epochs:
            self.made_way = {"reason": "too_slow", "why": f"{fit}, fewer than train.min_epochs ({train.min_epochs})",
                             "fit_epochs": epochs}
        elif train.recheck_epochs and epochs >= train.recheck_epochs:
            self.made_way = {"reason": "too_fast", "why": f"{fit}, at least train.recheck_epochs "
                                                          f"({train.recheck_epochs}): faster than measured",
                             "fit_epochs": epochs}
        return bool(self.made_way)

    def end_reason(self, st: TrainState) -> dict:
        """Why a completed run ended, for `run_end`: {} after its last epoch, else the reason and the epoch."""
        if st.early_stopped or self.annealing_to_stop:
            return {"reason": "early_stop", "early_stop_epoch": st.epoch}
        if self.out_of_budget:
            return {"reason": "budget", "budget_epoch": st.epoch}
        if self.made_way:
            return {"reason": self.made_way["reason"], "made_way": self.made_way["why"],
                    "fit_epochs": self.made_way["fit_epochs"]}
        return {}


def no_longer_improving(es: EarlyStopConfig, st: TrainState, metrics: dict, epochs: int = 0) -> bool:
    """Track `es.metric` in `st`; True once it has gone `patience_of(es, epochs)` epochs without improving by more
    than `es.min_delta` (val_acc and val_map must rise, val_loss fall). Always False with patience 0 (off)."""
    if not es.patience or metrics.get(es.metric) is None:
        return False
    value, best = metrics[es.metric], st.early_stop_best
    rises = es.metric in ("val_acc", "val_map")
    if best is None or (value > best + es.min_delta if rises else value < best - es.min_delta):
        st.early_stop_best, st.early_stop_wait = value, 0
    else:
        st.early_stop_wait += 1
    return st.early_stop_wait >= patience_of(es, epochs)


def patience_of(es: EarlyStopConfig, epochs: int) -> int:
    """The epochs early stopping waits: `es.patience`, or `es.share` of the run's `epochs` when that is more."""
    return max(es.patience, round(es.share * epochs))

"""The training loop of one run on one rank: epochs of steps, evaluation, checkpoints. Read top to bottom.

The parts come from `parts.build()`; parallelism is the strategy's and the optimizer step (unscale, clip,
non-finite policy, scaler) is the precision's, so nothing here branches on them. Events and console lines
go through the reporter. Host syncs (`.item()`, `.tolist()`) happen only at log steps and epoch ends (and
every step in `on_nonfinite: skip`, inside the precision); each one is commented.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics

import psutil
import torch

from trainer.core import clock
from trainer.core.config import EarlyStopConfig, RunConfig
from trainer.core.rundir import RunDir, RunDirDeleted
from trainer.core.schedule import progressive_size
from trainer.data import loader as data_mod
from trainer.data.frame import Frame
from trainer.deploy.evaluation import Predictions, top_classes, write_evaluation
from trainer.deploy.inference import LoadedModel, Preprocess
from trainer.deploy.multilabel import average_precision, mean_average_precision, write_multilabel_evaluation
from trainer.device.machine import CpuThreads
from trainer.device.precision import StepResult
from trainer.device.strategy import Strategy
from trainer.model.checkpoint import CheckpointWriter, TrainState, load_latest, save_checkpoint, writes_in_background
from trainer.train.optim import group_lrs
from trainer.train.parts import Parts
from trainer.train.reporter import Reporter
from trainer.train.stats import LAYER_STATS, histogram

log = logging.getLogger("trainer")

REPLAN_WINDOW = 10  # recent epochs whose mean time train.replan plans from
REPLAN_GROWTH = 1.1  # more epochs are planned only when more than this many times as many (+1) fit
REPLAN_MARGIN = 0.95  # share of the budget left that the re-planned epochs may fill
ANNEALED_SHARE = 0.9  # past this share of a budget's schedule the learning rate is annealed (one-cycle: < 6% of peak)
MAX_EPOCHS = 100000  # train.epochs' own limit
EVAL_BATCH_FACTOR = 2  # validation batches are this many training batches


class Diverged(RuntimeError):
    """Non-finite loss or gradient with train.on_nonfinite = stop."""


class Loop:
    # train.finish_images: seconds per image measured, of each validation and of training (at the last log step)
    eval_s_per_image: tuple[float, ...] = ()
    train_s_per_image = 0.0

    def __init__(self, run: RunDir, cfg: RunConfig, strategy: Strategy, parts: Parts, reporter: Reporter, stop):
        self.run, self.cfg, self.strategy, self.parts, self.reporter, self.stop = run, cfg, strategy, parts, reporter, stop
        self.state = TrainState()
        local_processes = max(1, strategy.world_size // max(1, cfg.device.nnodes))
        self.checkpoint_writer = CheckpointWriter(writes_in_background(cfg.checkpoint.writer, strategy.device,
                                                                       local_processes))
        # Gradient norms every step only when a step needs them (clipping, skipping); statistics need them at log steps.
        self.norms_every_step = bool(cfg.train.clip_grad_norm) or cfg.train.on_nonfinite == "skip"
        self._grad_histograms: dict = {}
        self._zero_frac = None
        self._val_rows: tuple[list[int], list[torch.Tensor]] = ([], [])  # evaluate's rows: (indices, logit batches)
        self.started = clock.now()  # train.budget counts from here (the engine sets the process's start)
        self.out_of_budget = False  # the run ended because train.budget was spent
        # why the run ended after its first epoch to make way for another network, when it did: {"reason": too_slow
        # (train.min_epochs) or too_fast (train.recheck_epochs), "why": in words}
        self.made_way: dict[str, str] = {}
        self.annealing_to_stop = False  # early stopping's patience ran out mid-schedule: the run anneals, then ends
        self.epoch_seconds: list[float] = []  # this launch's epochs, as measured (train.replan plans from them)
        self.trained_before_s = 0.0  # train.budget: what the run's earlier segments trained (resumed from a checkpoint)
        self.fit_started = clock.now()
        # validation predicts through the one inference path, as `main.py evaluate` does with the checkpoint
        self.frame = Frame.of(cfg.data)  # every batch's height, width and fit (training at another height scales it)
        self.inference = LoadedModel(parts.eval_net, parts.classes, Preprocess(
            self.frame, tuple(parts.mean), tuple(parts.std), parts.precision.amp,
            str(parts.memory_format).removeprefix("torch."), cfg.eval.tta))
        reporter.epochs = cfg.train.epochs
        one_cpu_process = strategy.device.type == "cpu" and strategy.world_size == 1
        self.cpu_threads = CpuThreads(torch.get_num_threads()) if cfg.device.share_cpu and one_cpu_process else None

    def fit(self) -> str:
        """Train the remaining epochs; 'completed', or 'stopped' when asked to stop (after checkpointing). torch's
        threads are given back as they were (device.share_cpu may have lent some to other programs): a process that
        trains in-process and goes on (the resident worker's LR finder, a test) keeps its threads."""
        try:
            return self._fit()
        finally:
            if self.cpu_threads is not None:
                torch.set_num_threads(self.cpu_threads.full)

    @contextlib.contextmanager
    def threads_fitted(self):
        """torch's threads as device.share_cpu last fitted them (`fit_threads`) inside the block, given back as they
        were after it: the end of a run (test set, exports) goes on with the threads training last had, and the LR
        finder fits them as it sweeps (issue #69)."""
        if self.cpu_threads is None:
            yield
            return
        torch.set_num_threads(self.cpu_threads.fitted)
        try:
            yield
        finally:
            torch.set_num_threads(self.cpu_threads.full)

    def _fit(self) -> str:
        cfg, st = self.cfg, self.state
        if self.parts.average is not None and st.step == 0:
            self.parts.average.reset()  # a fresh run: every rank's network holds rank 0's weights by now
        last_seconds = None
        if cfg.train.replan and cfg.train.budget and self.strategy.world_size == 1:
            # the schedule's share of the training time counts the earlier segments' (a resumed run)
            self.parts.stretch.deadline = (clock.now() - self.trained_before_s, self.training_ends())
        self.fit_started = clock.now()
        while st.epoch < cfg.train.epochs:
            # (with train.replan the plan made after the last epoch has already said whether this one fits)
            if last_seconds is not None and not cfg.train.replan and self.budget_left() < last_seconds:
                log.info("train.budget: %.1f min left, less than an epoch (%.0f s): the run ends here",
                         self.budget_left() / 60, last_seconds)
                self.out_of_budget = True
                return "completed"
            stretch = self.parts.stretch
            if stretch.deadline is not None and 1 <= st.epoch == cfg.train.epochs - 1:
                # the last epoch of a plan the trainer measured itself (not the probe's first guess): it ends annealed
                # even if the budget has time left then
                stretch.finish_by(st.step, cfg.train.epochs * self.parts.steps_per_epoch)
            start = clock.now()
            result = self.train_one_epoch()
            if result is None:
                return "stopped"
            train_loss, train_acc, images = result
            validating = clock.now()
            metrics = self.evaluate()
            self.eval_s_per_image += ((clock.now() - validating) / max(1, len(self.parts.data.val)),)
            if self.parts.stretch.deadline is not None and cfg.train.finish_images:
                # the time kept for the test set and the export, now at the validation speed measured
                self.parts.stretch.deadline = (self.parts.stretch.deadline[0], self.training_ends())
            seconds = last_seconds = clock.now() - start
            self.epoch_seconds.append(seconds)
            score = metrics[score_key(self.parts.data.multilabel)]
            is_best = score > st.best_acc
            st.best_acc = max(st.best_acc, score)
            if is_best:  # written before the epoch event: the app reads it on that event
                self.write_val_predictions(st.epoch + 1)
            self.reporter.emit("epoch", epoch=st.epoch + 1, epochs=cfg.train.epochs, step=st.step,
                               train_loss=train_loss, train_acc=train_acc, seconds=round(seconds, 3),
                               images_per_s=images / max(seconds, 1e-9), lr=self.lrs(),
                               image_size=self.image_size(st.epoch), **metrics)
            self.reporter.epoch_line(st.epoch + 1, train_loss, metrics, seconds)
            if self.strategy.is_main:
                self.run.write_status(epoch=st.epoch + 1, epochs=cfg.train.epochs, step=st.step,
                                      best_acc=st.best_acc, val_acc=metrics["val_acc"],
                                      best_metric=score_key(self.parts.data.multilabel))
            st.epoch += 1
            st.batch_in_epoch = 0
            st.early_stopped = no_longer_improving(cfg.train.early_stop, st, metrics, cfg.train.epochs)  # before the save
            if st.early_stopped and self.anneal_before_stopping():
                st.early_stopped = False  # the annealing epochs first; their end is the early stop
            if (cfg.train.replan and cfg.train.budget and not st.early_stopped and not self.out_of_budget
                    and not self.annealing_to_stop):
                self.replan()  # before the save: a run re-planned to end here saves its last epoch
            saved = (is_best or st.epoch % cfg.checkpoint.every_epochs == 0 or st.epoch == cfg.train.epochs
                     or st.early_stopped or self.out_of_budget or self.made_way)
            if saved:
                self.save(is_best=is_best)
            if st.early_stopped:
                es = cfg.train.early_stop
                log.info("early stop at epoch %d: %s has not improved by more than %g for %d epochs", st.epoch,
                         es.metric, es.min_delta, es.patience)
                return "completed"
            if self.out_of_budget:
                log.info("train.budget: %g min spent during epoch %d, which was cut short, validated and saved",
                         cfg.train.budget, st.epoch)
                return "completed"
            if self.made_way:
                return "completed"
            if st.epoch < cfg.train.epochs and self.stop_requested():
                if not saved:
                    self.save(is_best=False)
                return "stopped"
        return "completed"

    def anneal_before_stopping(self) -> bool:
        """Early stopping under a budget's schedule (`train.budget` and `train.replan`, one process): when its patience
        runs out while the learning rate is still far from annealed, stopping there would keep the weights of a high
        rate. The run anneals first: the schedule goes to its end over the next third of the patience (at least one
        epoch, within the epochs planned), and the run ends there, early stopped (a `replan` event says so). True while
        those epochs are to come; False when the schedule is annealed already (the run stops now)."""
        cfg, st, stretch = self.cfg, self.state, self.parts.stretch
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
        cfg.train.epochs = self.reporter.epochs = epochs
        stretch.finish_by(st.step, epochs * self.parts.steps_per_epoch)
        why = (f"early stopping: {es.metric} has not improved for {patience} epochs, with the learning rate not yet "
               f"annealed; it anneals over {epochs - st.epoch} more epoch{'s' if epochs - st.epoch > 1 else ''}, then "
               f"the run ends")
        self.reporter.emit("replan", epoch=st.epoch, old_epochs=old, epochs=epochs,
                           epoch_s=round(statistics.fmean(self.epoch_seconds or [0.0]), 3),
                           budget_left_s=round(self.budget_left(), 1), why=why)
        log.info("%s", why)
        if self.strategy.is_main:
            self.run.write_status(epochs=epochs)
        return True

    def replan(self) -> None:
        """train.replan: the epochs that fit in the budget left, from the mean time of the recent epochs (the first
        epoch of a launch, with its warm-up and cache building, only while it is the one measured; a mean, so the
        epochs that also write a checkpoint count); the schedule re-stretched to end there. Fewer epochs are planned
        as soon as they no longer fit, more only when clearly more fit (no re-plan on every epoch's noise). A
        `replan` event says old -> new and why. No time for a whole epoch: in one process a last one that the budget
        cuts short (the deadline anneals its schedule); across ranks the run ends here, as its budget would."""
        cfg, st = self.cfg, self.state
        measured = self.epoch_seconds[1:] or self.epoch_seconds
        estimate = statistics.fmean(measured[-REPLAN_WINDOW:])
        epochs = max(st.epoch, min(MAX_EPOCHS, st.epoch + int(self.budget_left() * REPLAN_MARGIN // estimate)))
        if epochs == st.epoch and self.parts.stretch.deadline is not None and self.budget_left() > 0:
            # no whole epoch fits: one more, cut short by the budget, on a schedule the deadline anneals (ending the
            # run here would leave its learning rate mid-way, planned for an epoch the machine turned out too slow for)
            epochs = st.epoch + 1
        old = cfg.train.epochs
        first_epoch = st.epoch == 1 and st.step == self.parts.steps_per_epoch and self.strategy.world_size == 1
        fit = f"{epochs} epochs fit in the {self.budget_left():.0f} s of the budget left at {estimate:.3g} s per epoch"
        if first_epoch and epochs < cfg.train.min_epochs:
            self.made_way = {"reason": "too_slow", "why": f"{fit}, fewer than train.min_epochs ({cfg.train.min_epochs})",
                             "fit_epochs": epochs}
        elif first_epoch and cfg.train.recheck_epochs and epochs >= cfg.train.recheck_epochs:
            self.made_way = {"reason": "too_fast", "why": f"{fit}, at least train.recheck_epochs "
                                                          f"({cfg.train.recheck_epochs}): faster than measured",
                             "fit_epochs": epochs}
        if self.made_way:
            self.reporter.emit("replan", epoch=st.epoch, old_epochs=old, epochs=st.epoch, epoch_s=round(estimate, 3),
                               budget_left_s=round(self.budget_left(), 1), why=self.made_way["why"] + ": the run ends here")
            log.info("train.%s: %s; the run ends after its first epoch",
                     "min_epochs" if self.made_way["reason"] == "too_slow" else "recheck_epochs", self.made_way["why"])
            return
        if epochs == old or (st.epoch < old < epochs <= old * REPLAN_GROWTH + 1):
            return  # (no re-plan on noise while the plan has epochs left; at its end any that fit are planned)
        cfg.train.epochs = epochs
        self.parts.stretch.restretch(st.step, epochs * self.parts.steps_per_epoch)
        self.reporter.epochs = epochs
        why = (f"{estimate:.3g} s per epoch measured, {self.budget_left():.0f} s of the budget left: "
               + ("faster than planned" if epochs > old else "slower than planned"))
        self.reporter.emit("replan", epoch=st.epoch, old_epochs=old, epochs=epochs, epoch_s=round(estimate, 3),
                           budget_left_s=round(self.budget_left(), 1), kept_s=round(self.kept_s(), 1), why=why)
        log.info("train.replan: %d -> %d epochs (%s)", old, epochs, why)
        if epochs == st.epoch:
            self.out_of_budget = True  # the budget ends the run here, as it would at the next epoch's start
        if self.strategy.is_main:
            self.run.write_status(epochs=epochs)

    def image_size(self, epoch: int) -> int:
        """The training image height of `epoch` (train.progressive_resize, the width in proportion; validation is
        always at data.image_size)."""
        return progressive_size(self.cfg.data.image_size, self.cfg.train.progressive_resize, epoch,
                                self.cfg.train.epochs)

    def budget_left(self) -> float:
        """Seconds of train.budget left for training (infinite without one): the time train.finish_images keeps for
        what comes after training is not training's."""
        if not self.cfg.train.budget:
            return math.inf
        return self.training_ends() - clock.now()

    def training_ends(self) -> float:
        """When training must end on the trainer's clock: the end of train.budget less the time kept for the test set
        and the exports (train.finish_images at the validation speed measured; before the first validation, at a
        third of the training time per image: a forward pass of the three passes of a training step)."""
        return self.started + self.cfg.train.budget * 60 - self.kept_s()

    def kept_s(self) -> float:
        """The seconds train.finish_images keeps for after training, at the validation speed measured so far (the
        median of this launch's validations, the first's warm-up left out once there are others; before the first, a
        third of the training time per image: a forward pass of a training step's three passes)."""
        measured = self.eval_s_per_image[1:] or self.eval_s_per_image
        per_image = statistics.median(measured) if measured else self.train_s_per_image / 3
        return self.cfg.train.finish_images * per_image

    def end_reason(self) -> dict:
        """Why a completed run ended, for `run_end`: {} after its last epoch, else the reason and the epoch."""
        if self.state.early_stopped or self.annealing_to_stop:
            return {"reason": "early_stop", "early_stop_epoch": self.state.epoch}
        if self.out_of_budget:
            return {"reason": "budget", "budget_epoch": self.state.epoch}
        if self.made_way:
            return {"reason": self.made_way["reason"], "made_way": self.made_way["why"],
                    "fit_epochs": self.made_way["fit_epochs"]}
        return {}

    def train_one_epoch(self) -> tuple[float | None, float | None, int] | None:
        """(mean loss, accuracy, images) of the epoch (loss and accuracy None when none of its images are known);
        None when stopped part-way (after checkpointing)."""
        cfg, st, s, parts = self.cfg, self.state, self.strategy, self.parts
        batches = parts.epoch_batches(cfg, s, st.epoch)
        size = self.image_size(st.epoch)
        if st.batch_in_epoch == 0:
            parts.aug_generator.manual_seed(cfg.train.seed * 1_000_003 + st.epoch * 1009 + s.rank)
        parts.train_mode(st.epoch)
        skip_mode = cfg.train.on_nonfinite == "skip"
        epoch_totals = torch.zeros(3, device=s.device)  # loss * images, correct, images
        if st.batch_in_epoch and st.epoch_so_far and s.is_main:  # resumed mid-epoch: the part trained before counts
            epoch_totals += torch.tensor(st.epoch_so_far, device=s.device)
        st.epoch_so_far, self.epoch_totals = None, epoch_totals
        window = torch.zeros(3, device=s.device)  # loss sum, count, non-finite losses: since the last log step
        images_done, last_log = 0, (clock.now(), 0)
        epoch_started = last_log[0]
        for images, labels in data_mod.iterate_batches(parts.data.train, batches[st.batch_in_epoch:], parts.workers,
                                                       self.frame, s.device):
            index = st.batch_in_epoch
            last_micro = (index + 1) % cfg.train.grad_accum_steps == 0 or index + 1 == len(batches)
            log_now = last_micro and (st.step + 1) % cfg.monitor.log_every == 0
            x = parts.augment(images, parts.aug_generator)
            if size != cfg.data.image_size:
                x = torch.nn.functional.interpolate(x, size=self.frame.scaled(size).shape, mode="bilinear",
                                                    antialias=True)
            y = labels.to(s.device, non_blocking=True)
            x, target = parts.augment.mix(x, y, parts.aug_generator, len(parts.classes))  # MixUp, CutMix: when on
            loss, logits, result = self.train_step(x, target, last_micro=last_micro, log_now=log_now)
            clock.charge_images(cfg.model.name, x.shape[0], x.shape[-2], x.shape[-1])  # a simulated device's time
            finite = torch.isfinite(loss)
            if skip_mode:  # a skipped step's loss is reported by its warning, not averaged in (nor divergence)
                loss = torch.where(finite, loss, torch.zeros_like(loss))
                window += torch.stack([loss, finite.float(), torch.zeros_like(loss)])
            else:
                window += torch.stack([loss, torch.ones_like(loss), (~finite).float()])
            n = torch.full_like(loss, y.shape[0])
            epoch_totals += torch.stack([loss * n, hits(logits, y), n])
            images_done += y.shape[0]
            st.batch_in_epoch += 1
            if cfg.train.finish_images:
                self.train_s_per_image = (clock.now() - epoch_started) / images_done
            if result is None or result.skipped:
                continue
            if log_now:
                self.fit_threads()
                last_log, stop = self.log_step(window, result, len(batches), images_done, last_log)
                if stop and cfg.train.budget and not self.stop.requested:  # agreed: every rank breaks here
                    self.out_of_budget = True  # the epoch so far is validated and saved; the run ends
                    break
                if stop:
                    self.save(is_best=False)
                    return None
            elif s.world_size == 1 and self.stop.requested:
                self.save(is_best=False)
                return None
            elif s.world_size == 1 and cfg.train.budget and self.budget_left() <= 0:
                # one process: the budget is read at every step (a log step can be minutes away on a slow machine);
                # across ranks it is agreed at log steps
                self.out_of_budget = True
                break
            if cfg.monitor.histogram_every and st.step % cfg.monitor.histogram_every == 0:
                self.emit_histograms()
            if cfg.checkpoint.every_steps and st.step % cfg.checkpoint.every_steps == 0:
                self.save(is_best=False)
        totals = s.all_reduce_sum(torch.cat([epoch_totals, window[2:]])).tolist()  # host sync at epoch end
        self.epoch_totals = None
        if totals[3] > 0:
            raise Diverged(self.divergence_message(st.step, float("nan")))
        if not totals[2]:  # resumed at its end from a checkpoint without the epoch's totals (an older one)
            return None, None, 0
        return totals[0] / totals[2], totals[1] / totals[2], images_done * s.world_size

    def fit_threads(self) -> None:
        """device.share_cpu: torch's threads fitted to the cores other programs leave (a warning says so)."""
        changed = self.cpu_threads.check() if self.cpu_threads is not None else None
        if changed is None:
            return
        old, new, others = changed
        why = (f"other programs are using {others:.1f} of the {psutil.cpu_count()} cores: training on {new} "
               f"thread(s) instead of {old}" if new < old else
               f"the other programs left cores free ({others:.1f} used): training on {new} threads again")
        self.reporter.emit("warning", kind="cpu_threads", message=f"{why} (device.share_cpu)", step=self.state.step)
        log.info("device.share_cpu: %s", why)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, *, last_micro: bool = True,
                   log_now: bool = False) -> tuple[torch.Tensor, torch.Tensor, StepResult | None]:
        """Forward and backward of one micro-batch, then (on the last micro-batch) the optimizer step.

        Returns the detached loss and logits, and the step's result (None while accumulating).
        """
        cfg, st, parts = self.cfg, self.state, self.parts
        with self.strategy.no_sync(parts.model, accumulating=not last_micro):
            with parts.precision.autocast():
                logits = parts.model(x)
                loss = parts.criterion(logits, y)
            parts.precision.backward(loss / cfg.train.grad_accum_steps)
        if not last_micro:
            return loss.detach().float(), logits.detach(), None
        stats_now = log_now and cfg.monitor.grad_stats
        every = cfg.monitor.histogram_every
        histograms_now = every and (st.step + 1) % every == 0 and self.strategy.is_main

        def inspect(result: StepResult) -> None:  # the final gradients, just before the optimizer step
            if histograms_now:
                params = dict(zip(parts.monitor.names, parts.monitor.params))
                self._grad_histograms = {n: histogram(params[n].grad, cfg.monitor.histogram_bins)
                                         for n in parts.histogram_layers if params[n].grad is not None}
            if stats_now:
                self._zero_frac = parts.monitor.zero_fractions()
                parts.monitor.snapshot_weights()

        parts.drop_frozen_grads(st.epoch)
        result = parts.precision.step(parts.optimizer, parts.monitor, clip=cfg.train.clip_grad_norm,
                                      need_norms=self.norms_every_step or stats_now,
                                      on_nonfinite=cfg.train.on_nonfinite, inspect=inspect)
        if result.skipped:
            self.reporter.warning("nonfinite_skipped", f"non-finite gradient at step {st.step + 1} (first in "
                                  f"{result.first_nonfinite}); step skipped", step=st.step + 1,
                                  layer=result.first_nonfinite)
        else:
            parts.scheduler.step()
            st.step += 1
            if parts.average is not None:
                parts.average.update(st.step)
        return loss.detach().float(), logits.detach(), result

    def log_step(self, window: torch.Tensor, result: StepResult, batches: int, images_done: int,
                 last_log: tuple[float, int]) -> tuple[tuple[float, int], bool]:
        """The step event (+ gradient statistics and warnings) of a log step; resets the window. Also whether any
        rank was asked to stop."""
        st, s, parts = self.state, self.strategy, self.parts
        if s.is_main and not self.run.path.is_dir():  # deleted under us: stop now, not at the end of the epoch
            raise RunDirDeleted(self.run.path, st.epoch + 1, st.step)
        # Agreed by every rank (one all-reduce): loss sum, count, non-finite losses, non-finite gradients, stop
        # requests; so every rank takes the same divergence and stop decisions.
        zero = torch.zeros((), device=s.device)
        nonfinite = result.nonfinite if result.nonfinite is not None else zero
        stop = zero + (1.0 if self.stop.requested or self.budget_left() <= 0 else 0.0)
        shared = s.all_reduce_sum(torch.cat([window, torch.stack([nonfinite, stop])]))
        parts_out = [shared]
        if result.total_norm is not None:
            parts_out.append(result.total_norm.reshape(1).float())
        stats = self.cfg.monitor.grad_stats and result.grad_norms is not None
        if stats:  # its first row is the gradient norms
            parts_out.append(parts.monitor.layer_table(result.grad_norms, self._zero_frac).flatten())
        elif result.grad_norms is not None:
            parts_out.append(result.grad_norms)
        values = torch.cat(parts_out).tolist()  # the one host sync of the log step
        window.zero_()
        loss_sum, count, nonfinite_losses, nonfinite_grads, stops = values[:5]
        loss_mean = loss_sum / max(count, 1)
        if nonfinite_losses > 0 or nonfinite_grads > 0:
            layer = self.first_nonfinite_layer(values[6:]) if result.grad_norms is not None else None
            raise Diverged(self.divergence_message(st.step, loss_mean, layer))
        now = clock.now()
        rate = (images_done - last_log[1]) * s.world_size / max(now - last_log[0], 1e-9)
        grad_norm = values[5] if result.total_norm is not None else None
        if grad_norm is not None and not math.isfinite(grad_norm) and parts.precision.scaled:
            grad_norm = None  # an fp16 loss-scale overflow: the scaler skipped the step and lowered its scale
        self.reporter.emit("step", step=st.step, epoch=st.epoch + 1, batch=st.batch_in_epoch, batches=batches,
                           loss=loss_mean, lr=self.lrs(), images_per_s=rate, grad_norm=grad_norm)
        if stats:
            n = len(parts.monitor.names)
            table = values[6:]
            self.reporter.emit("grad_stats", step=st.step, **{key: table[i * n:(i + 1) * n]
                                                               for i, key in enumerate(LAYER_STATS)})
        for warning in parts.anomalies.check(st.step, loss_mean, grad_norm):
            self.reporter.warning(**warning)
        self.reporter.maybe_system()
        self.reporter.step_progress(st.epoch + 1, st.batch_in_epoch, batches, loss_mean)
        return (now, images_done), stops > 0

    def first_nonfinite_layer(self, table: list[float]) -> str | None:
        """The first layer (in model order) whose gradient norm in a `layer_table` read-back is not finite."""
        names = self.parts.monitor.names
        return next((name for name, norm in zip(names, table[:len(names)]) if not math.isfinite(norm)), None)

    @torch.inference_mode()
    def evaluate(self) -> dict:
        """Validation loss, accuracy (top-5 with more than 5 classes), per-class accuracy and the confusion matrix.

        At the training precision and memory format, without autograd bookkeeping, in batches twice the training
        batch (no activations are kept for a backward pass, so they fit where training's did)."""
        cfg, s, parts = self.cfg, self.strategy, self.parts
        n = len(parts.classes)
        if parts.data.multilabel:
            return self.evaluate_multilabel()
        parts.eval_net.eval()  # unwrapped: evaluation needs no gradient sync
        s.share_buffers(parts.eval_net)  # every rank validates the network the checkpoint holds
        loss_sum = torch.zeros((), device=s.device)
        top5 = torch.zeros((), device=s.device)
        confusion = torch.zeros(n * n, device=s.device)
        batches = data_mod.epoch_batches(len(parts.data.val), EVAL_BATCH_FACTOR * cfg.data.batch_size, seed=0,
                                         epoch=0, rank=s.rank, world=s.world_size, shuffle=False, pad=False)
        kept = []  # this rank's per-image logits, for eval/val when the epoch is the best (val_rows)
        for images, labels in data_mod.iterate_batches(parts.data.val, batches, parts.workers, self.frame,
                                                       s.device):
            y = labels.to(s.device, non_blocking=True)
            logits = self.inference.logits(images, s.device)
            clock.charge_images(cfg.model.name, images.shape[0], images.shape[-2], images.shape[-1], evaluating=True)
            loss_sum += parts.criterion(logits, y) * y.shape[0]
            kept.append(logits.float())  # stays on the device: one copy when written, no sync per batch
            top = top_classes(logits, 5 if n > 5 else 1)  # ties as in metrics.json: one prediction an image
            confusion += torch.bincount(y * n + top[:, 0], minlength=n * n).float()
            if n > 5:
                top5 += (top == y[:, None]).any(1).sum()
        self._val_rows = ([i for batch in batches for i in batch], kept)  # joined only at a best epoch (val_logits)
        totals = s.all_reduce_sum(torch.cat([loss_sum[None], top5[None], confusion])).cpu()  # host sync
        conf = totals[2:].view(n, n)
        seen = conf.sum().clamp_min(1)
        support = conf.sum(1)
        # A class without validation images has no accuracy (null), which is not the same as 0%.
        per_class = [None if support[i] == 0 else (conf[i, i] / support[i]).item() for i in range(n)]
        out = {"val_loss": (totals[0] / seen).item(), "val_acc": (conf.diag().sum() / seen).item(),
               "per_class_acc": per_class, "confusion": conf.long().tolist()}
        if n > 5:
            out["val_top5"] = (totals[1] / seen).item()
        parts.train_mode(self.state.epoch)
        return out

    @torch.inference_mode()
    def evaluate_multilabel(self) -> dict:
        """Multi-label validation: loss, mAP (macro, micro; trainer.deploy.multilabel) and label accuracy (each
        image-label pair right at 0.5). Every rank ends with every image's logits (each fills its own rows, then one
        sum), so mAP is measured on the whole split."""
        cfg, s, parts = self.cfg, self.strategy, self.parts
        parts.eval_net.eval()
        total = len(parts.data.val)
        logits_all = torch.zeros(total, len(parts.classes), device=s.device)
        targets = torch.zeros_like(logits_all)
        loss_sum = torch.zeros((), device=s.device)
        batches = data_mod.epoch_batches(total, EVAL_BATCH_FACTOR * cfg.data.batch_size, seed=0, epoch=0,
                                         rank=s.rank, world=s.world_size, shuffle=False, pad=False)
        for index, (images, labels) in zip(batches, data_mod.iterate_batches(parts.data.val, batches, parts.workers,
                                                                             self.frame, s.device)):
            y = labels.to(s.device, non_blocking=True).float()
            logits = self.inference.logits(images, s.device).float()
            clock.charge_images(cfg.model.name, images.shape[0], images.shape[-2], images.shape[-1], evaluating=True)
            loss_sum += parts.criterion(logits, y) * y.shape[0]
            logits_all[index], targets[index] = logits, y
        both = s.all_reduce_sum(torch.cat([loss_sum[None], logits_all.flatten(), targets.flatten()])).cpu()
        size = logits_all.numel()
        logits_all, targets = both[1:1 + size].view_as(logits_all), both[1 + size:].view_as(logits_all)
        self._val_rows = (list(range(total)), [logits_all])  # every rank holds the whole split's already
        macro, micro = mean_average_precision(logits_all, targets)
        per_label = [average_precision(logits_all[:, j], targets[:, j]) for j in range(len(parts.classes))]
        parts.train_mode(self.state.epoch)
        return {"val_loss": (both[0] / max(total, 1)).item(), "val_map": macro or 0.0, "val_map_micro": micro or 0.0,
                "val_acc": ((logits_all >= 0) == (targets > 0.5)).float().mean().item(), "per_class_ap": per_label}

    def write_val_predictions(self, epoch: int) -> None:
        """The best epoch's per-image validation predictions, in eval/val/ (the app reads them): the logits
        `evaluate` computed, each rank's rows gathered (a collective: every rank calls it), written by rank 0. The
        same numbers as the epoch's val_acc, whatever the launcher."""
        parts, s = self.parts, self.strategy
        samples = parts.data.val.samples
        logits = self.val_logits(len(samples))
        if not s.is_main:
            return
        labels = torch.tensor([label for _, label in samples])
        if parts.data.multilabel:  # the thresholds chosen here are the run's: evaluate, predict and exports use them
            write_multilabel_evaluation(self.run.path, "val", [p for p, _ in samples], logits, labels,
                                        parts.classes, extra={"epoch": epoch})
            return
        preds = Predictions([p for p, _ in samples], labels, logits)
        write_evaluation(self.run.path, "val", preds, parts.classes, extra={"epoch": epoch})

    def val_logits(self, total: int) -> torch.Tensor:
        """Every validation image's logits from the last `evaluate`, in the split's order (float32, on the CPU): each
        rank fills its own rows, one sum gathers them (a rank's rows are disjoint: pad=False)."""
        rows, batches = self._val_rows
        logits = torch.cat(batches) if batches else torch.zeros(0, len(self.parts.classes), device=self.strategy.device)
        if self.parts.data.multilabel or self.strategy.world_size == 1:
            return logits.cpu()
        whole = torch.zeros(total, len(self.parts.classes), device=self.strategy.device)
        if rows:
            whole[torch.tensor(rows, device=whole.device)] = logits
        return self.strategy.all_reduce_sum(whole).cpu()

    def emit_histograms(self) -> None:
        """Histograms of the chosen layers: weights after this step, gradients as they were before it."""
        if not self.strategy.is_main:
            return
        bins, parts = self.cfg.monitor.histogram_bins, self.parts
        params = dict(zip(parts.monitor.names, parts.monitor.params))
        for name in parts.histogram_layers:
            self.reporter.emit("histogram", step=self.state.step, layer=name, kind="weight",
                               **histogram(params[name], bins))
            if name in self._grad_histograms:
                self.reporter.emit("histogram", step=self.state.step, layer=name, kind="grad",
                                   **self._grad_histograms[name])
        self._grad_histograms = {}

    def stop_requested(self) -> bool:
        """Whether any rank was asked to stop (a collective under DDP, so call it on every rank alike)."""
        flag = torch.tensor([1.0 if self.stop.requested else 0.0], device=self.strategy.device)
        return bool(self.strategy.all_reduce_max(flag).item())  # host sync: only at log steps

    def lrs(self) -> list[float]:
        return group_lrs(self.parts.optimizer)

    def divergence_message(self, step: int, loss: float, layer: str | None = None) -> str:
        layer = layer or self.parts.monitor.first_nonfinite()
        where = f"first non-finite gradient in {layer}" if layer else "non-finite loss"
        return (f"training diverged at step {step}: loss {loss:.4g}, {where}; lower optimizer.lr, set "
                f"train.clip_grad_norm, or train.on_nonfinite: skip")

    # ---- checkpoints -------------------------------------------------------------------------
    def budget_state(self) -> dict | None:
        """What a resumed run with train.budget continues from: the budget's seconds spent (from this segment's
        process start, and the earlier segments'), the seconds trained, the epochs as re-planned and the schedule's
        clock (train.replan's re-stretch)."""
        if not self.cfg.train.budget:
            return None
        s, now = self.parts.stretch, clock.now()
        return {"spent_s": round(now - self.started, 3), "trained_s": round(now - self.fit_started
                                                                            + self.trained_before_s, 3),
                "epochs": self.cfg.train.epochs,
                "stretch": {"total": s.total, "origin_step": s.origin_step, "origin_virtual": s.origin_virtual,
                            "end_step": s.end_step}}

    def continue_budget(self, saved: dict | None) -> None:
        """A resumed run with train.budget spends what its earlier segments left, not a new budget: the budget's
        clock moved back by what they spent; with train.replan, the epochs they re-planned and the schedule's clock
        where they left it (the learning rate goes on from where it was, annealing by the same end)."""
        cfg = self.cfg
        if not cfg.train.budget or not saved:
            return
        self.started -= float(saved["spent_s"])
        self.trained_before_s = float(saved.get("trained_s", 0.0))
        stretch = saved.get("stretch") or {}
        if cfg.train.replan and stretch.get("total") == self.parts.stretch.total:
            cfg.train.epochs = self.reporter.epochs = int(saved["epochs"])
            s = self.parts.stretch
            s.origin_step, s.origin_virtual, s.end_step = (stretch["origin_step"], stretch["origin_virtual"],
                                                           stretch["end_step"])
        log.info("train.budget: %.0f s spent by the earlier segments, %.0f s left; %d epochs planned",
                 float(saved["spent_s"]), self.budget_left(), cfg.train.epochs)

    def save(self, is_best: bool) -> None:
        """Rank 0 writes the checkpoint; every rank waits so none runs ahead into the next collective."""
        st = self.state
        if st.batch_in_epoch and self.epoch_totals is not None:  # mid-epoch: the epoch's totals so far, every rank's
            st.epoch_so_far = self.strategy.all_reduce_sum(self.epoch_totals.clone()).tolist()
        if self.strategy.is_main:
            parts = self.parts
            st.budget = self.budget_state()
            state = st.to_checkpoint(model=parts.eval_net, trained=parts.net if parts.average else None,
                                     optimizer=parts.optimizer, scheduler=parts.scheduler,
                                     precision=parts.precision, aug_generator=parts.aug_generator,
                                     config=self.cfg.to_dict(), classes=parts.classes, mean=parts.mean, std=parts.std,
                                     memory_format=parts.memory_format)
            path = save_checkpoint(self.run.checkpoints, state, is_best=is_best,
                                   keep_last=self.cfg.checkpoint.keep_last, writer=self.checkpoint_writer)
            self.reporter.emit("checkpoint", path=str(path), epoch=st.epoch, step=st.step, best=is_best,
                               mid_epoch=st.batch_in_epoch > 0)
            log.info("saved %s%s", path.name, " (best)" if is_best else "")
        self.strategy.barrier()

    def resume(self) -> str | None:
        """Continue from the run's newest loadable checkpoint; its path, or None when there is none."""
        found = load_latest(self.run.checkpoints)
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", self.run.checkpoints)
            return None
        state, path = found
        if list(state.get("classes", [])) != self.parts.classes:
            raise ValueError(f"{path}: checkpoint classes {state.get('classes')} differ from the dataset's "
                             f"{self.parts.classes}")
        parts = self.parts
        self.state.restore(state, model=parts.net, optimizer=parts.optimizer, scheduler=parts.scheduler,
                           precision=parts.precision, aug_generator=parts.aug_generator,
                           average=parts.average.module if parts.average else None)
        st = self.state
        self.continue_budget(st.budget)
        log.info("resumed from %s at epoch %d, batch %d, step %d", path, st.epoch + 1, st.batch_in_epoch, st.step)
        return str(path)


def hits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A training batch's right answers: images whose top class is the label; multi-label (multi-hot `y`), the
    share of each image's labels right at 0.5, summed."""
    if y.dim() == 2:
        return ((logits >= 0) == (y > 0.5)).float().mean(1).sum()
    return (logits.argmax(1) == y).sum().float()


def score_key(multilabel: bool) -> str:
    """The validation metric the best epoch is chosen by: val_acc, or multi-label runs' val_map."""
    return "val_map" if multilabel else "val_acc"


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

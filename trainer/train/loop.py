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

import psutil
import torch

from trainer.core import clock
from trainer.core.config import RunConfig
from trainer.core.rundir import RunDir, RunDirDeleted
from trainer.core.schedule import progressive_size
from trainer.data import loader as data_mod
from trainer.data.frame import Frame
from trainer.device.machine import CpuThreads
from trainer.device.precision import StepResult
from trainer.device.strategy import Strategy
from trainer.model.checkpoint import CheckpointWriter, TrainState, load_latest, save_checkpoint, writes_in_background
from trainer.train.budget import Budget
from trainer.train.optim import group_lrs
from trainer.train.parts import Parts
from trainer.train.plan import EpochPlan, no_longer_improving
from trainer.train.reporter import Reporter
from trainer.train.stats import LAYER_STATS, histogram
from trainer.train.validation import Validation

log = logging.getLogger("trainer")


class Diverged(RuntimeError):
    """Non-finite loss or gradient with train.on_nonfinite = stop."""


class Loop:
    def __init__(self, run: RunDir, cfg: RunConfig, strategy: Strategy, parts: Parts, reporter: Reporter, stop,
                 started: float | None = None):
        self.run, self.cfg, self.strategy, self.parts, self.reporter, self.stop = run, cfg, strategy, parts, reporter, stop
        self.state = TrainState()
        local_processes = max(1, strategy.world_size // max(1, cfg.device.nnodes))
        self.checkpoint_writer = CheckpointWriter(writes_in_background(cfg.checkpoint.writer, strategy.device,
                                                                       local_processes))
        # Gradient norms every step only when a step needs them (clipping, skipping); statistics need them at log steps.
        self.norms_every_step = bool(cfg.train.clip_grad_norm) or cfg.train.on_nonfinite == "skip"
        self._grad_histograms: dict = {}
        self._zero_frac = None
        self.budget = Budget(cfg.train, started)  # train.budget counts from `started` (the engine's process start)
        self.plan = EpochPlan(cfg, self.budget, parts.stretch, parts.steps_per_epoch, reporter, strategy.world_size,
                              run.write_status if strategy.is_main else None)
        self.frame = Frame.of(cfg.data)  # every batch's height, width and fit (training at another height scales it)
        self.validation = Validation(run, cfg, strategy, parts, self.frame)
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
        cfg, st, plan, stretch = self.cfg, self.state, self.plan, self.parts.stretch
        if self.parts.average is not None and st.step == 0:
            self.parts.average.reset()  # a fresh run: every rank's network holds rank 0's weights by now
        if plan.replanning and self.strategy.world_size == 1:
            # the schedule's share of the training time counts the earlier segments' (a resumed run)
            stretch.deadline = (clock.now() - self.budget.trained_before_s, self.budget.ends())
        self.budget.fit_started = clock.now()
        while st.epoch < cfg.train.epochs:
            # (with train.replan the plan made after the last epoch has already said whether this one fits)
            if plan.epoch_seconds and not cfg.train.replan and self.budget.left() < plan.epoch_seconds[-1]:
                log.info("train.budget: %.1f min left, less than an epoch (%.0f s): the run ends here",
                         self.budget.left() / 60, plan.epoch_seconds[-1])
                plan.out_of_budget = True
                return "completed"
            if stretch.deadline is not None and 1 <= st.epoch == cfg.train.epochs - 1:
                # the last epoch of a plan the trainer measured itself (not the probe's first guess): it ends annealed
                # even if the budget has time left then
                stretch.finish_by(st.step, cfg.train.epochs * self.parts.steps_per_epoch)
            start = clock.now()
            result = self.train_one_epoch()
            ended = "stopped" if result is None else self._end_epoch(result, start)
            if ended:
                return ended
        return "completed"

    def _end_epoch(self, result: tuple[float | None, float | None, int], start: float) -> str | None:
        """An epoch trained: validated, reported, planned again (train.replan) and checkpointed; how the run ends
        here ('completed', 'stopped'), or None to go on."""
        cfg, st, plan, parts = self.cfg, self.state, self.plan, self.parts
        train_loss, train_acc, images = result
        validating = clock.now()
        metrics = self.validation.evaluate(st.epoch)
        self.budget.validated(clock.now() - validating, len(parts.data.val))
        if parts.stretch.deadline is not None and cfg.train.finish_images:
            # the time kept for the test set and the export, now at the validation speed measured
            parts.stretch.deadline = (parts.stretch.deadline[0], self.budget.ends())
        seconds = clock.now() - start
        plan.epoch_seconds.append(seconds)
        score = metrics[score_key(parts.data.multilabel)]
        is_best = score > st.best_acc
        st.best_acc = max(st.best_acc, score)
        if is_best:  # written before the epoch event: the app reads it on that event
            self.validation.write_predictions(st.epoch + 1)
        self.reporter.emit("epoch", epoch=st.epoch + 1, epochs=cfg.train.epochs, step=st.step,
                           train_loss=train_loss, train_acc=train_acc, seconds=round(seconds, 3),
                           images_per_s=images / max(seconds, 1e-9), lr=group_lrs(parts.optimizer),
                           image_size=epoch_image_size(cfg, st.epoch), **metrics)
        self.reporter.epoch_line(st.epoch + 1, train_loss, metrics, seconds)
        if self.strategy.is_main:
            self.run.write_status(epoch=st.epoch + 1, epochs=cfg.train.epochs, step=st.step, best_acc=st.best_acc,
                                  val_acc=metrics["val_acc"], best_metric=score_key(parts.data.multilabel))
        st.epoch += 1
        st.batch_in_epoch = 0
        st.early_stopped = no_longer_improving(cfg.train.early_stop, st, metrics, cfg.train.epochs)  # before the save
        if st.early_stopped and plan.anneal_before_stopping(st):
            st.early_stopped = False  # the annealing epochs first; their end is the early stop
        if plan.replanning and not (st.early_stopped or plan.out_of_budget or plan.annealing_to_stop):
            plan.replan(st)  # before the save: a run re-planned to end here saves its last epoch
        saved = (is_best or st.epoch % cfg.checkpoint.every_epochs == 0 or st.epoch == cfg.train.epochs
                 or st.early_stopped or plan.out_of_budget or plan.made_way)
        if saved:
            self.save(is_best=is_best)
        if st.early_stopped:
            es = cfg.train.early_stop
            log.info("early stop at epoch %d: %s has not improved by more than %g for %d epochs", st.epoch,
                     es.metric, es.min_delta, es.patience)
        elif plan.out_of_budget:
            log.info("train.budget: %g min spent during epoch %d, which was cut short, validated and saved",
                     cfg.train.budget, st.epoch)
        if st.early_stopped or plan.out_of_budget or plan.made_way:
            return "completed"
        if st.epoch < cfg.train.epochs and self.stop_requested():
            if not saved:
                self.save(is_best=False)
            return "stopped"
        return None

    def train_one_epoch(self) -> tuple[float | None, float | None, int] | None:
        """(mean loss, accuracy, images) of the epoch (loss and accuracy None when none of its images are known);
        None when stopped part-way (after checkpointing)."""
        cfg, st, s, parts = self.cfg, self.state, self.strategy, self.parts
        batches = parts.epoch_batches(cfg, s, st.epoch)
        size = epoch_image_size(cfg, st.epoch)
        if st.batch_in_epoch == 0:
            parts.aug_generator.manual_seed(cfg.train.seed * 1_000_003 + st.epoch * 1009 + s.rank)
        parts.train_mode(st.epoch)
        epoch_totals = torch.zeros(3, device=s.device)  # loss * images, correct, images
        if st.batch_in_epoch and st.epoch_so_far and s.is_main:  # resumed mid-epoch: the part trained before counts
            epoch_totals += torch.tensor(st.epoch_so_far, device=s.device)
        st.epoch_so_far, self.epoch_totals = None, epoch_totals
        window = torch.zeros(3, device=s.device)  # loss sum, count, non-finite losses: since the last log step
        images_done, last_log = 0, (clock.now(), 0)
        epoch_started = last_log[0]
        for images, labels in data_mod.iterate_batches(parts.data.train, batches[st.batch_in_epoch:], parts.workers,
                                                       self.frame, s.device):
            log_now = (st.step + 1) % cfg.monitor.log_every == 0
            result, done = self._train_batch(images, labels, size, len(batches), log_now, window, epoch_totals)
            images_done += done
            if cfg.train.finish_images:
                self.budget.train_s_per_image = (clock.now() - epoch_started) / images_done
            if result is None or result.skipped:
                continue
            if log_now:
                self.fit_threads()
                last_log, stop = self.log_step(window, result, len(batches), images_done, last_log)
                if stop and cfg.train.budget and not self.stop.requested:  # agreed: every rank breaks here
                    self.plan.out_of_budget = True  # the epoch so far is validated and saved; the run ends
                    break
                if stop:
                    self.save(is_best=False)
                    return None
            elif s.world_size == 1 and self.stop.requested:
                self.save(is_best=False)
                return None
            elif s.world_size == 1 and cfg.train.budget and self.budget.left() <= 0:
                # one process: the budget is read at every step (a log step can be minutes away on a slow machine);
                # across ranks it is agreed at log steps
                self.plan.out_of_budget = True
                break
            if cfg.monitor.histogram_every and st.step % cfg.monitor.histogram_every == 0:
                self.emit_histograms()
            if cfg.checkpoint.every_steps and st.step % cfg.checkpoint.every_steps == 0:
                self.save(is_best=False)
        totals = s.all_reduce_sum(torch.cat([epoch_totals, window[2:]])).tolist()  # host sync at epoch end
        self.epoch_totals = None
        if totals[3] > 0:
            raise Diverged(divergence_message(st.step, float("nan"), parts.monitor.first_nonfinite()))
        if not totals[2]:  # resumed at its end from a checkpoint without the epoch's totals (an older one)
            return None, None, 0
        return totals[0] / totals[2], totals[1] / totals[2], images_done * s.world_size

    def _train_batch(self, images: torch.Tensor, labels: torch.Tensor, size: int, batches: int, log_now: bool,
                     window: torch.Tensor, epoch_totals: torch.Tensor) -> tuple[StepResult | None, int]:
        """One batch trained (augmented, at the epoch's size, mixed), its loss and hits added to the log step's
        `window` and the epoch's totals; the step's result (None while accumulating gradients) and its images."""
        cfg, st, s, parts = self.cfg, self.state, self.strategy, self.parts
        index = st.batch_in_epoch
        last_micro = (index + 1) % cfg.train.grad_accum_steps == 0 or index + 1 == batches
        x = parts.augment(images, parts.aug_generator)
        if size != cfg.data.image_size:
            x = torch.nn.functional.interpolate(x, size=self.frame.scaled(size).shape, mode="bilinear", antialias=True)
        y = labels.to(s.device, non_blocking=True)
        x, target = parts.augment.mix(x, y, parts.aug_generator, len(parts.classes))  # MixUp, CutMix: when on
        loss, logits, result = self.train_step(x, target, last_micro=last_micro, log_now=log_now and last_micro)
        clock.charge_images(cfg.model.name, x.shape[0], x.shape[-2], x.shape[-1])  # a simulated device's time
        finite = torch.isfinite(loss)
        if cfg.train.on_nonfinite == "skip":  # a skipped step's loss is reported by its warning, not averaged in
            loss = torch.where(finite, loss, torch.zeros_like(loss))
            window += torch.stack([loss, finite.float(), torch.zeros_like(loss)])
        else:
            window += torch.stack([loss, torch.ones_like(loss), (~finite).float()])
        n = torch.full_like(loss, y.shape[0])
        epoch_totals += torch.stack([loss * n, hits(logits, y), n])
        st.batch_in_epoch += 1
        return result, y.shape[0]

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
        stop = zero + (1.0 if self.stop.requested or self.budget.left() <= 0 else 0.0)
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
            layer = first_nonfinite_layer(parts.monitor.names, values[6:]) if result.grad_norms is not None else None
            raise Diverged(divergence_message(st.step, loss_mean, layer or parts.monitor.first_nonfinite()))
        now = clock.now()
        rate = (images_done - last_log[1]) * s.world_size / max(now - last_log[0], 1e-9)
        grad_norm = values[5] if result.total_norm is not None else None
        if grad_norm is not None and not math.isfinite(grad_norm) and parts.precision.scaled:
            grad_norm = None  # an fp16 loss-scale overflow: the scaler skipped the step and lowered its scale
        self.reporter.emit("step", step=st.step, epoch=st.epoch + 1, batch=st.batch_in_epoch, batches=batches,
                           loss=loss_mean, lr=group_lrs(parts.optimizer), images_per_s=rate, grad_norm=grad_norm)
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

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self, is_best: bool) -> None:
        """Rank 0 writes the checkpoint; every rank waits so none runs ahead into the next collective."""
        st = self.state
        if st.batch_in_epoch and self.epoch_totals is not None:  # mid-epoch: the epoch's totals so far, every rank's
            st.epoch_so_far = self.strategy.all_reduce_sum(self.epoch_totals.clone()).tolist()
        if self.strategy.is_main:
            parts = self.parts
            st.budget = self.budget.saved(self.cfg.train.epochs, parts.stretch)
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
        epochs = self.budget.go_on_from(st.budget, parts.stretch)
        if epochs is not None:
            self.cfg.train.epochs = self.reporter.epochs = epochs
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


def epoch_image_size(cfg: RunConfig, epoch: int) -> int:
    """The training image height of `epoch` (train.progressive_resize, the width in proportion; validation is always
    at data.image_size)."""
    return progressive_size(cfg.data.image_size, cfg.train.progressive_resize, epoch, cfg.train.epochs)


def first_nonfinite_layer(names: list[str], table: list[float]) -> str | None:
    """The first layer (in model order) whose gradient norm in a `layer_table` read-back is not finite."""
    return next((name for name, norm in zip(names, table[:len(names)]) if not math.isfinite(norm)), None)


def divergence_message(step: int, loss: float, layer: str | None) -> str:
    where = f"first non-finite gradient in {layer}" if layer else "non-finite loss"
    return (f"training diverged at step {step}: loss {loss:.4g}, {where}; lower optimizer.lr, set "
            f"train.clip_grad_norm, or train.on_nonfinite: skip")

"""The training loop: one run in one run directory, on one rank.

Read top to bottom: set-up, resume, then per epoch `train_one_epoch` and `evaluate`, events and
checkpoints. Parallelism and precision live in `strategy.py`; the loop calls them, never branches on them.
Host syncs (`.item()`, `.cpu()`) happen only at log steps and epoch ends; each one is commented.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import psutil
import torch

from trainer import data as data_mod
from trainer.checkpoint import BackgroundSync, load_latest, save_checkpoint
from trainer.config import ConfigError, RunConfig, load_config
from trainer.events import EventWriter, NullEventWriter
from trainer.groups import pattern_matches
from trainer.models import ModelError, build_model, choose_memory_format
from trainer.optim import build_loss, build_optimizer, build_param_groups, build_scheduler
from trainer.rundir import RunDir
from trainer.scan import DataError
from trainer.stats import AnomalyWatch, GradMonitor, global_norm, histogram
from trainer.strategy import Precision, Strategy, choose_precision, fast_gpu_math, make_strategy

log = logging.getLogger("trainer")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3
INPUT_ERRORS = (ConfigError, DataError, ModelError)  # the user's input is at fault: exit 2, message as is


class Diverged(RuntimeError):
    """Non-finite loss or gradient with train.on_nonfinite = stop."""


class StopRequest:
    """Set by SIGTERM/SIGINT, or when a launched worker's launcher is gone; the loop stops at the next safe
    point and checkpoints."""

    def __init__(self, watch_parent: bool = False):
        self._requested = False
        self._parent = os.getppid() if watch_parent else None

    @property
    def requested(self) -> bool:
        if not self._requested and self._parent is not None and os.getppid() != self._parent:
            log.warning("the launcher (pid %d) is gone: stopping", self._parent)
            self._requested = True
        return self._requested

    @requested.setter
    def requested(self, value: bool) -> None:
        self._requested = value

    def install(self) -> None:
        def handler(signum, frame):
            if not self.requested:
                log.info("received %s: stopping after the current step", signal.Signals(signum).name)
            self.requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


@dataclass
class Progress:
    epoch: int = 0  # epoch in progress (0-based)
    batch_in_epoch: int = 0  # micro-batches of `epoch` already trained
    step: int = 0  # optimizer steps so far
    best_acc: float = -1.0
    history: list = field(default_factory=list)


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup_logging(run: RunDir, rank: int) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(f"%(asctime)s {'' if rank == 0 else f'[rank {rank}] '}%(levelname)s %(message)s",
                            "%H:%M:%S")
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(fmt)
    root.addHandler(stderr)
    if rank == 0:
        file_handler = logging.FileHandler(run.log, encoding="utf-8")
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)


class Loop:
    """State shared by the epoch functions of one run."""

    def __init__(self, run: RunDir, cfg: RunConfig, strategy: Strategy, events, stop: StopRequest):
        self.run, self.cfg, self.strategy, self.events, self.stop = run, cfg, strategy, events, stop
        self.progress = Progress()
        self.last_system = 0.0
        self._grad_histograms: dict = {}
        self.checkpoint_sync = BackgroundSync()  # checkpoint fsyncs run while training goes on
        self.process = psutil.Process()

    # ---- set-up ------------------------------------------------------------------------------
    def setup(self, resume: bool) -> None:
        cfg, strategy = self.cfg, self.strategy
        seed_everything(cfg.train.seed + strategy.rank)
        self.workers = data_mod.default_workers(cfg.data.num_workers)
        self.prepare("scan", f"scanning {cfg.data.train_dir}")
        self.data = data_mod.load_data(cfg.data, cfg.train.seed, self.workers, self.cache_progress())
        for path, reason in self.data.skipped:
            log.warning("skipping %s: %s", path, reason)
        if self.data.skipped:
            self.events.emit("warning", kind="bad_files", count=len(self.data.skipped),
                             message=f"{len(self.data.skipped)} unusable files skipped (listed in train.log)",
                             files=[{"path": p, "reason": r} for p, r in self.data.skipped[:100]])
        self.classes = self.data.classes
        if strategy.device.type == "cuda":
            fast_gpu_math()
            data_mod.keep_on_device(self.data, strategy.device)
        self.prepare("model", f"building {cfg.model.name}")
        model = build_model(cfg.model, len(self.classes), cfg.data.image_size, cfg.train.seed)
        self.memory_format = choose_memory_format(cfg.train.memory_format, cfg.model.name, model)
        model = model.to(memory_format=self.memory_format)
        self.groups = build_param_groups(model, cfg.optimizer)
        self.model = strategy.wrap(model)
        self.net = strategy.unwrap(self.model)
        self.optimizer = build_optimizer(self.groups, cfg.optimizer)
        self.train_batches_per_epoch = len(self._batches(0))
        self.steps_per_epoch = math.ceil(self.train_batches_per_epoch / cfg.train.grad_accum_steps)
        self.scheduler = build_scheduler(self.optimizer, self.steps_per_epoch, cfg.train.epochs, cfg.scheduler)
        self.precision_name, self.precision_reason = choose_precision(cfg.train.amp, strategy.device)
        self.precision = Precision(self.precision_name, strategy.device)
        if cfg.train.compile:
            log.info("compiling the model (torch.compile); the first steps are slow")
            self.model.compile()
        self.criterion = build_loss(cfg.loss, len(self.classes))
        self.augment = data_mod.BatchAugment(cfg.data.augment, cfg.data.mean, cfg.data.std, strategy.device,
                                             self.memory_format)
        self.aug_generator = torch.Generator()
        self.monitor = GradMonitor(self.net)
        mon = cfg.monitor
        self.anomalies = AnomalyWatch(mon.loss_spike_factor, mon.grad_explode, mon.grad_vanish)
        names = self.monitor.names
        chosen = [n for n in names if any(pattern_matches(p, n) for p in mon.histogram_layers)]
        self.histogram_layers = chosen or ([names[0], names[-1]] if len(names) > 1 else names)
        # Gradient norms every step only when a step needs them (clipping, skipping); statistics need them at log steps.
        self.norms_every_step = bool(cfg.train.clip_grad_norm) or cfg.train.on_nonfinite == "skip"
        self.resumed_from = self._resume() if resume else None

    def prepare(self, phase: str, message: str, **fields) -> None:
        """What the run is doing before its first step (the app shows it instead of a frozen dashboard)."""
        self.events.emit("prepare", phase=phase, message=message, **fields)

    def cache_progress(self):
        """A progress callback for decoding into the cache: a `prepare` event at most every 0.5 s, a log line per 10%."""
        shown = {"time": 0.0, "tenth": 0}

        def report(done: int, total: int) -> None:
            now = time.monotonic()
            if done == total or now - shown["time"] >= 0.5:
                shown["time"] = now
                self.prepare("cache", f"decoding images into the cache: {done}/{total}", done=done, total=total)
            tenth = done * 10 // max(total, 1)
            if tenth > shown["tenth"] and self.strategy.is_main:
                shown["tenth"] = tenth
                log.info("decoding images into the cache: %d/%d", done, total)

        return report

    def _batches(self, epoch: int) -> list[list[int]]:
        s = self.strategy
        return data_mod.epoch_batches(len(self.data.train), self.cfg.data.batch_size, seed=self.cfg.train.seed,
                                      epoch=epoch, rank=s.rank, world=s.world_size)

    def _resume(self) -> str | None:
        found = load_latest(self.run.checkpoints)
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", self.run.checkpoints)
            return None
        state, path = found
        if list(state.get("classes", [])) != self.classes:
            raise ValueError(f"{path}: checkpoint classes {state.get('classes')} differ from the dataset's "
                             f"{self.classes}")
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("scaler", {}))
        p = self.progress
        p.epoch, p.batch_in_epoch, p.step = state["epoch"], state["batch_in_epoch"], state["step"]
        p.best_acc = state.get("best_acc", -1.0)
        set_rng_state(state["rng"])
        if state.get("aug_rng") is not None:
            self.aug_generator.set_state(state["aug_rng"])
        log.info("resumed from %s at epoch %d, batch %d, step %d", path, p.epoch + 1, p.batch_in_epoch, p.step)
        return str(path)

    # ---- the run -----------------------------------------------------------------------------
    def run_start_event(self) -> None:
        cfg = self.cfg
        self.events.emit(
            "run_start", config=cfg.to_dict(), classes=self.classes, train_size=len(self.data.train),
            val_size=len(self.data.val), world_size=self.strategy.world_size, device=self.strategy.description,
            cache=self.data.cache, workers=self.workers, steps_per_epoch=self.steps_per_epoch,
            precision=self.precision_name, precision_reason=self.precision_reason,
            memory_format=str(self.memory_format).removeprefix("torch."), compiled=cfg.train.compile,
            param_groups=[{"name": g["name"], "tensors": len(g["params"]),
                           "params": sum(p.numel() for p in g["params"])} for g in self.groups],
            parameters=sum(p.numel() for p in self.net.parameters()),
            trainable=sum(p.numel() for p in self.net.parameters() if p.requires_grad),
            layers=self.monitor.names, resumed_from=self.resumed_from, start_epoch=self.progress.epoch,
            start_step=self.progress.step)
        if not self.strategy.is_main:
            return
        log.info("training %s on %d images (%d classes), validating on %d; %s; %s (%s); cache %s; %d workers",
                 cfg.model.name, len(self.data.train), len(self.classes), len(self.data.val),
                 self.strategy.description, self.precision_name, self.precision_reason, self.data.cache, self.workers)

    def fit(self) -> str:
        cfg, p = self.cfg, self.progress
        while p.epoch < cfg.train.epochs:
            start = time.time()
            result = self.train_one_epoch()
            if result is None:
                return "stopped"
            train_loss, train_acc, images = result
            metrics = self.evaluate()
            seconds = time.time() - start
            is_best = metrics["val_acc"] > p.best_acc
            p.best_acc = max(p.best_acc, metrics["val_acc"])
            self.events.emit("epoch", epoch=p.epoch + 1, epochs=cfg.train.epochs, step=p.step,
                             train_loss=train_loss, train_acc=train_acc, seconds=round(seconds, 3),
                             images_per_s=images / max(seconds, 1e-9), lr=self.lrs(), **metrics)
            if self.strategy.is_main:
                self.print_epoch(metrics, train_loss, seconds)
                self.run.write_status(epoch=p.epoch + 1, epochs=cfg.train.epochs, step=p.step,
                                      best_acc=p.best_acc, val_acc=metrics["val_acc"])
            p.epoch += 1
            p.batch_in_epoch = 0
            saved = is_best or p.epoch % cfg.checkpoint.every_epochs == 0 or p.epoch == cfg.train.epochs
            if saved:
                self.save(is_best=is_best)
            if p.epoch < cfg.train.epochs and self.stop_requested():
                if not saved:
                    self.save(is_best=False)
                return "stopped"
        return "completed"

    def stop_requested(self) -> bool:
        """Whether any rank was asked to stop (a collective under DDP, so call it on every rank alike)."""
        flag = torch.tensor([1.0 if self.stop.requested else 0.0], device=self.strategy.device)
        return bool(self.strategy.all_reduce_max(flag).item())  # host sync: only at log steps

    def lrs(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def train_one_epoch(self) -> tuple[float, float, int] | None:
        """(mean loss, accuracy, images) of the epoch; None when stopped part-way (after checkpointing)."""
        cfg, p, s = self.cfg, self.progress, self.strategy
        accum = cfg.train.grad_accum_steps
        batches = self._batches(p.epoch)
        if p.batch_in_epoch == 0:
            self.aug_generator.manual_seed(cfg.train.seed * 1_000_003 + p.epoch * 1009 + s.rank)
        remaining = batches[p.batch_in_epoch:]
        self.model.train()
        dev = s.device
        epoch_loss = torch.zeros((), device=dev)
        epoch_correct = torch.zeros((), device=dev)
        epoch_seen = torch.zeros((), device=dev)
        log_loss = torch.zeros((), device=dev)
        log_count = torch.zeros((), device=dev)
        nonfinite = torch.zeros((), dtype=torch.bool, device=dev)
        images_done, last_log_time, last_log_images = 0, time.time(), 0
        n_batches = len(batches)
        pin = dev.type == "cuda"
        for images, labels in data_mod.iterate_batches(self.data.train, remaining, self.workers,
                                                       cfg.data.image_size, pin):
            index = p.batch_in_epoch
            last_micro = (index + 1) % accum == 0 or index + 1 == n_batches
            x = self.augment(images, self.aug_generator)
            y = labels.to(dev, non_blocking=True)
            with s.no_sync(self.model, accumulating=not last_micro):
                with self.precision.autocast():
                    logits = self.model(x)
                    loss = self.criterion(logits, y)
                self.precision.backward(loss / accum)
            loss_d = loss.detach().float()
            nonfinite |= ~torch.isfinite(loss_d)
            log_loss += loss_d
            log_count += 1
            epoch_loss += loss_d * y.shape[0]
            epoch_correct += (logits.detach().argmax(1) == y).sum()
            epoch_seen += y.shape[0]
            images_done += y.shape[0]
            p.batch_in_epoch += 1
            if not last_micro:
                continue

            log_now = (p.step + 1) % cfg.monitor.log_every == 0
            grad_norms = total_norm = None
            self.precision.unscale(self.optimizer)
            if self.norms_every_step or (log_now and cfg.monitor.grad_stats):
                grad_norms = self.monitor.grad_norms()
                total_norm = global_norm(grad_norms)
                if cfg.train.on_nonfinite == "skip" and not torch.isfinite(total_norm).item():  # host sync
                    self.skip_step(p.step, self.monitor.first_nonfinite())
                    continue
                if log_now and not torch.isfinite(total_norm).item():  # host sync, log steps only
                    raise Diverged(self.divergence_message(p.step + 1, log_loss.item() / max(log_count.item(), 1)))
                if cfg.train.clip_grad_norm:
                    torch.nn.utils.clip_grads_with_norm_(self.monitor.params, cfg.train.clip_grad_norm, total_norm)
            if cfg.monitor.histogram_every and (p.step + 1) % cfg.monitor.histogram_every == 0 and s.is_main:
                params = dict(zip(self.monitor.names, self.monitor.params))
                self._grad_histograms = {n: histogram(params[n].grad, cfg.monitor.histogram_bins)
                                         for n in self.histogram_layers if params[n].grad is not None}
            zero_frac = None
            if log_now and cfg.monitor.grad_stats:
                zero_frac = self.monitor.zero_fractions()
                self.monitor.snapshot_weights()
            self.precision.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            p.step += 1

            if log_now:
                # The one host sync of the log interval: loss, non-finite flag and grad norms together.
                totals = s.all_reduce_sum(torch.stack([log_loss, log_count]))
                loss_mean = (totals[0] / totals[1].clamp_min(1)).item()
                if bool(nonfinite.item()) or (total_norm is not None and not math.isfinite(total_norm.item())):
                    raise Diverged(self.divergence_message(p.step, loss_mean))
                now = time.time()
                rate = (images_done - last_log_images) * s.world_size / max(now - last_log_time, 1e-9)
                last_log_time, last_log_images = now, images_done
                self.events.emit("step", step=p.step, epoch=p.epoch + 1, batch=p.batch_in_epoch, batches=n_batches,
                                 loss=loss_mean, lr=self.lrs(), images_per_s=rate,
                                 grad_norm=None if total_norm is None else total_norm.item())
                if cfg.monitor.grad_stats and s.is_main:
                    self.events.emit("grad_stats", step=p.step, **self.monitor.layer_stats(grad_norms, zero_frac))
                for warning in self.anomalies.check(p.step, loss_mean, None if total_norm is None else total_norm.item()):
                    log.warning("%s", warning["message"])
                    self.events.emit("warning", **warning)
                log_loss.zero_()
                log_count.zero_()
                self.maybe_system_event()
                if s.is_main:
                    self.print_progress(n_batches, loss_mean)
                if self.stop_requested():
                    self.save(is_best=False)
                    return None
            elif s.world_size == 1 and self.stop.requested:
                self.save(is_best=False)
                return None
            if cfg.monitor.histogram_every and p.step % cfg.monitor.histogram_every == 0 and s.is_main:
                self.emit_histograms()
            if cfg.checkpoint.every_steps and p.step % cfg.checkpoint.every_steps == 0:
                self.save(is_best=False)
        if bool(nonfinite.item()):  # host sync at epoch end
            raise Diverged(self.divergence_message(p.step, float("nan")))
        totals = s.all_reduce_sum(torch.stack([epoch_loss, epoch_correct, epoch_seen]))
        totals = totals.tolist()  # host sync at epoch end
        seen = max(totals[2], 1.0)
        return totals[0] / seen, totals[1] / seen, images_done * s.world_size

    def emit_histograms(self) -> None:
        """Histograms of the chosen layers: weights after this step, gradients as they were before it."""
        bins = self.cfg.monitor.histogram_bins
        params = dict(zip(self.monitor.names, self.monitor.params))
        for name in self.histogram_layers:
            self.events.emit("histogram", step=self.progress.step, layer=name, kind="weight",
                             **histogram(params[name], bins))
            if name in self._grad_histograms:
                self.events.emit("histogram", step=self.progress.step, layer=name, kind="grad",
                                 **self._grad_histograms[name])
        self._grad_histograms = {}

    def skip_step(self, step: int, layer: str | None) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        message = f"non-finite gradient at step {step + 1} (first in {layer}); step skipped"
        log.warning(message)
        self.events.emit("warning", kind="nonfinite_skipped", step=step + 1, layer=layer, message=message)

    def divergence_message(self, step: int, loss: float) -> str:
        layer = self.monitor.first_nonfinite()
        where = f"first non-finite gradient in {layer}" if layer else "non-finite loss"
        return (f"training diverged at step {step}: loss {loss:.4g}, {where}; lower optimizer.lr, set "
                f"train.clip_grad_norm, or train.on_nonfinite: skip")

    @torch.no_grad()
    def evaluate(self) -> dict:
        cfg, s = self.cfg, self.strategy
        n_classes = len(self.classes)
        net = self.net  # unwrapped: evaluation needs no gradient sync
        net.eval()
        dev = s.device
        loss_sum = torch.zeros((), device=dev)
        top5 = torch.zeros((), device=dev)
        confusion = torch.zeros(n_classes * n_classes, device=dev)
        batches = data_mod.epoch_batches(len(self.data.val), cfg.data.batch_size, seed=0, epoch=0, rank=s.rank,
                                         world=s.world_size, shuffle=False, pad=False)
        for images, labels in data_mod.iterate_batches(self.data.val, batches, self.workers, cfg.data.image_size,
                                                       dev.type == "cuda"):
            x = self.augment(images, None)
            y = labels.to(dev, non_blocking=True)
            with self.precision.autocast():
                logits = net(x)
                loss_sum += self.criterion(logits, y).float() * y.shape[0]
            pred = logits.argmax(1)
            confusion += torch.bincount(y * n_classes + pred, minlength=n_classes * n_classes).float()
            if n_classes > 5:
                top5 += (logits.topk(5, dim=1).indices == y[:, None]).any(1).sum()
        totals = s.all_reduce_sum(torch.cat([loss_sum[None], top5[None], confusion])).cpu()  # host sync
        conf = totals[2:].view(n_classes, n_classes)
        seen = conf.sum().clamp_min(1)
        per_class = (conf.diag() / conf.sum(1).clamp_min(1)).tolist()
        out = {"val_loss": (totals[0] / seen).item(), "val_acc": (conf.diag().sum() / seen).item(),
               "per_class_acc": per_class, "confusion": conf.long().tolist()}
        if n_classes > 5:
            out["val_top5"] = (totals[1] / seen).item()
        self.model.train()
        return out

    def save(self, is_best: bool) -> None:
        """Rank 0 writes the checkpoint; every rank waits so none runs ahead into the next collective."""
        if self.strategy.is_main:
            p, cfg = self.progress, self.cfg
            state = {
                "format": "traindeck-checkpoint", "version": 1,
                "model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.precision.state_dict(),
                "epoch": p.epoch, "batch_in_epoch": p.batch_in_epoch, "step": p.step, "best_acc": p.best_acc,
                "rng": rng_state(), "aug_rng": self.aug_generator.get_state(),
                "config": cfg.to_dict(), "classes": self.classes, "model_name": cfg.model.name,
                "preprocess": {"image_size": cfg.data.image_size, "mean": cfg.data.mean, "std": cfg.data.std,
                               "resize": "short side to image_size, centre crop"},
            }
            path = save_checkpoint(self.run.checkpoints, state, is_best=is_best, keep_last=cfg.checkpoint.keep_last,
                                   sync=self.checkpoint_sync)
            self.events.emit("checkpoint", path=str(path), epoch=p.epoch, step=p.step, best=is_best,
                             mid_epoch=p.batch_in_epoch > 0)
            log.info("saved %s%s", path.name, " (best)" if is_best else "")
        self.strategy.barrier()

    def maybe_system_event(self) -> None:
        now = time.time()
        if not self.strategy.is_main or now - self.last_system < self.cfg.monitor.system_every_s:
            return
        self.last_system = now
        procs = [self.process] + self.process.children(recursive=True)
        cpu = rss = 0.0
        for proc in procs:
            try:
                cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        gpus = []
        if self.strategy.device.type == "cuda":
            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                try:
                    util = torch.cuda.utilization(i)
                except Exception:  # noqa: BLE001 - needs pynvml; report memory alone
                    util = None
                gpus.append({"index": i, "memory_used_mb": (total - free) / 2**20,
                             "memory_total_mb": total / 2**20, "utilization": util})
        self.events.emit("system", cpu_percent=cpu, rss_mb=rss / 2**20, processes=len(procs), gpus=gpus)

    def print_progress(self, n_batches: int, loss: float) -> None:
        if not sys.stdout.isatty():
            return
        p = self.progress
        done = int(30 * p.batch_in_epoch / max(n_batches, 1))
        sys.stdout.write(f"\repoch {p.epoch + 1}/{self.cfg.train.epochs} [{'#' * done}{'.' * (30 - done)}] "
                         f"loss {loss:.4f}")
        sys.stdout.flush()

    def print_epoch(self, metrics: dict, train_loss: float, seconds: float) -> None:
        p = self.progress
        end = "\r" if sys.stdout.isatty() else ""
        print(f"{end}epoch {p.epoch + 1}/{self.cfg.train.epochs}  train_loss {train_loss:.4f}  "
              f"val_loss {metrics['val_loss']:.4f}  val_acc {100 * metrics['val_acc']:.1f}%  "
              f"({seconds:.1f}s)" + " " * 20, flush=True)


def describe_failure(exc: BaseException) -> str:
    """A one-line reason for a failed run, with a hint for the failures users can fix."""
    if isinstance(exc, INPUT_ERRORS):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}".strip()
    oom = isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(exc)
    if oom:
        return (f"out of memory ({text.splitlines()[0][:200]}); try a smaller data.batch_size, a smaller "
                f"data.image_size or train.amp bf16/fp16")
    return text.splitlines()[0][:500] if text else type(exc).__name__


def run_worker(run_dir: str, resume: bool = False) -> int:
    """Train the run in `run_dir` on this rank; returns the process exit code."""
    run = RunDir(run_dir)
    cfg = load_config(run.config)
    stop = StopRequest(watch_parent="RANK" in os.environ)  # torchrun / spawn workers must not outlive them
    stop.install()
    strategy = make_strategy(cfg)
    setup_logging(run, strategy.rank)
    events = EventWriter(run.events) if strategy.is_main else NullEventWriter()
    loop = Loop(run, cfg, strategy, events, stop)
    state, message, code = "failed", "", EXIT_FAILED
    try:
        if strategy.is_main:
            run.write_status(state="running", message="", worker_pid=os.getpid())
        loop.setup(resume)
        loop.run_start_event()
        state = loop.fit()
        loop.checkpoint_sync.wait()  # durable before the run reports itself finished
        code = EXIT_OK
        message = "stopped by request; resume to continue" if state == "stopped" else ""
    except Diverged as e:
        state, message, code = "diverged", str(e), EXIT_DIVERGED
        log.error("%s", message)
        events.emit("error", kind="diverged", message=message, rank=strategy.rank, step=loop.progress.step)
    except Exception as e:  # noqa: BLE001 - every failure is reported, never silent
        state, code = "failed", EXIT_FAILED
        message = describe_failure(e)
        if isinstance(e, INPUT_ERRORS):
            code = EXIT_BAD_INPUT
        log.error("run failed: %s\n%s", message, traceback.format_exc())
        events.emit("error", kind=type(e).__name__, message=message, rank=strategy.rank,
                    traceback=traceback.format_exc()[-4000:])
        _write_rank_error(run, strategy.rank, message)
    finally:
        try:
            loop.checkpoint_sync.close()
        except OSError as e:
            log.error("the last checkpoint may not be durable: %s", e)
        best = loop.progress.best_acc if loop.progress.best_acc >= 0 else None
        events.emit("run_end", status=state, message=message, best_acc=best, epochs_completed=loop.progress.epoch,
                    step=loop.progress.step)
        if strategy.is_main:
            run.write_status(state=state, message=message, best_acc=best, ended=time.time(), exit_code=code)
        events.close()
        strategy.shutdown()
    if strategy.is_main:
        log.info("run %s: %s%s", run.name, state, f" ({message})" if message else "")
    return code


def _write_rank_error(run: RunDir, rank: int, message: str) -> None:
    """Ranks other than 0 cannot write events; the launcher reads this file to name them."""
    if rank == 0:
        return
    try:
        (run.path / f"rank-{rank}.error").write_text(f"rank {rank}: {message}\n", encoding="utf-8")
    except OSError:
        pass


"""What a run tells the outside: events (rank 0 only), console progress lines and system samples.

The loop says what happened (`reporter.step(...)`, `reporter.epoch(...)`); this module decides who writes it
and how it looks, so the loop has no rank checks and no formatting.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from trainer.core.events import EventWriter, NullEventWriter
from trainer.data.scan import printable_path

log = logging.getLogger("trainer")


class Reporter:
    def __init__(self, events: EventWriter | NullEventWriter, is_main: bool, system_every_s: float = 2.0,
                 gpu_sampler: Callable[[], list[dict]] | None = None, sinks: list[Callable[[dict], None]] | None = None,
                 launcher_pid: int | None = None):
        self.events = events
        self.sinks = sinks or []  # more consumers of the written events (TensorBoard, MLflow)
        self.is_main = is_main
        self.system_every_s = system_every_s
        self.gpu_sampler = gpu_sampler
        self.epochs = 0
        self._last_system = 0.0
        self._root = run_root(launcher_pid)
        self._seen: dict[int, psutil.Process] = {}  # the same objects each sample: their CPU is measured between

    def emit(self, event: str, **fields) -> None:
        record = self.events.emit(event, **fields)
        for sink in self.sinks:
            sink(record)

    def prepare(self, phase: str, message: str, **fields) -> None:
        """What the run is doing before its first step (the app shows it instead of a frozen dashboard)."""
        self.emit("prepare", phase=phase, message=message, **fields)

    def cache_progress(self) -> Callable[[int, int], None]:
        """A progress callback for decoding into the cache: `prepare` events, and a log line per 10%."""
        shown = {"tenth": 0}

        def describe(done: int, total: int) -> str:
            tenth = done * 10 // max(total, 1)
            if tenth > shown["tenth"] and self.is_main:
                shown["tenth"] = tenth
                log.info("decoding images into the cache: %d/%d", done, total)
            return f"decoding images into the cache: {done}/{total}"

        return self._throttled("cache", describe)

    def download_progress(self) -> Callable[[int, int], None]:
        """A progress callback for fetching pretrained weights (bytes): `prepare` events."""
        def describe(done: int, total: int) -> str:
            size = f"{done / 1e6:.1f}/{total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
            return f"downloading pretrained weights: {size}"

        return self._throttled("weights", describe)

    def _throttled(self, phase: str, describe: Callable[[int, int], str]) -> Callable[[int, int], None]:
        """(done, total) -> a `prepare` event of `phase` at most every 0.5 s, and one at the end."""
        last = {"time": 0.0}

        def report(done: int, total: int) -> None:
            message = describe(done, total)
            now = time.monotonic()
            if done == total or now - last["time"] >= 0.5:
                last["time"] = now
                self.prepare(phase, message, done=done, total=total)

        return report

    def warning(self, kind: str, message: str, **fields) -> None:
        log.warning("%s", message)
        self.emit("warning", kind=kind, message=message, **fields)

    def bad_files(self, skipped: list[tuple[str, str]]) -> None:
        for path, reason in skipped:
            log.warning("skipping %s: %s", printable_path(path), reason)
        if skipped:
            self.emit("warning", kind="bad_files", count=len(skipped),
                      message=f"{len(skipped)} unusable files skipped (listed in train.log)",
                      files=[{"path": p, "reason": r} for p, r in skipped[:100]])

    def step_progress(self, epoch: int, batch: int, batches: int, loss: float) -> None:
        """A progress bar on a terminal (nothing in a log file)."""
        if not self.is_main or not sys.stdout.isatty():
            return
        done = int(30 * batch / max(batches, 1))
        sys.stdout.write(f"\repoch {epoch}/{self.epochs} [{'#' * done}{'.' * (30 - done)}] loss {loss:.4f}")
        sys.stdout.flush()

    def epoch_line(self, epoch: int, train_loss: float | None, metrics: dict, seconds: float) -> None:
        if not self.is_main:
            return
        end = "\r" if sys.stdout.isatty() else ""
        score = f"val_map {100 * metrics['val_map']:.1f}%" if "val_map" in metrics else \
            f"val_acc {100 * metrics['val_acc']:.1f}%"
        loss = "—" if train_loss is None else f"{train_loss:.4f}"
        print(f"{end}epoch {epoch}/{self.epochs}  train_loss {loss}  val_loss {metrics['val_loss']:.4f}  "
              f"{score}  ({seconds:.1f}s)" + " " * 20, flush=True)

    def maybe_system(self) -> None:
        """CPU, memory and GPU use of the trainer's processes, at most every `system_every_s`."""
        now = time.time()
        if not self.is_main or now - self._last_system < self.system_every_s:
            return
        self._last_system = now
        try:
            procs = [self._root] + self._root.children(recursive=True)
        except psutil.Error:  # the launcher above this rank has gone
            self._root = psutil.Process()
            procs = [self._root] + self._root.children(recursive=True)
        self._seen = {p.pid: self._seen.get(p.pid, p) for p in procs}
        cpu = rss = 0.0
        for proc in self._seen.values():
            try:
                cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        gpus = self.gpu_sampler() if self.gpu_sampler else []
        self.emit("system", cpu_percent=cpu, rss_mb=rss / 2**20, processes=len(procs), gpus=gpus)

    def close(self) -> None:
        for sink in self.sinks:
            getattr(sink, "close", lambda: None)()
        self.events.close()


def run_root(launcher_pid: int | None) -> psutil.Process:
    """The process a run's processes descend from: its launcher (`main.py train`, whose pid status.json keeps) when
    that is this process or one above it, so that every rank (torchrun's, mp.spawn's) and loader is counted; else
    this process."""
    me = psutil.Process()
    try:
        if isinstance(launcher_pid, int) and launcher_pid in (me.pid, *(p.pid for p in me.parents())):
            return psutil.Process(launcher_pid)
    except psutil.Error:  # the launcher went
        pass
    return me


def reporter_for(events_path, is_main: bool, system_every_s: float, gpu_sampler=None,
                 tensorboard: bool = False, mlflow: str | None = None, mlflow_experiment: str = "",
                 launcher_pid: int | None = None) -> Reporter:
    """Rank 0 writes the event stream (and, asked to, TensorBoard files beside it and an MLflow run at the tracking
    URI `mlflow`); the other ranks report nothing."""
    events = EventWriter(events_path) if is_main else NullEventWriter()
    sinks = []
    if tensorboard and is_main:
        from trainer.train.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(Path(events_path).parent))
    if mlflow and is_main:
        from trainer.train.mlflow_sink import MLflowSink

        sinks.append(MLflowSink(Path(events_path).parent, mlflow, mlflow_experiment))
    return Reporter(events, is_main, system_every_s, gpu_sampler, sinks, launcher_pid if is_main else None)

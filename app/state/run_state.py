"""RunState: everything the app knows about one run, built from its events. Qt-free.

`apply(event)` folds one event of `events.jsonl` (docs/events.md) into numpy buffers and summaries, and
says which kind of change it was, so a watcher (`RunModel`) can tell its views. Live, re-attached and
replayed runs all go through here.
"""

from __future__ import annotations

import logging
import time

from app.state.buffers import Matrix, Series
from trainer.core.rundir import FINAL_STATES, LIVE_STATES, RunDir

STOP_GRACE_STEPS = 5  # Stop waits this many measured steps beyond its floor: the step in flight, the ranks'
STOP_GRACE_CAP_S = 600  # agreement to stop and the checkpoint's write, on this machine as it runs now
log = logging.getLogger(__name__)
CLOCK_SLACK_S = 5.0  # a host's clock may run a little behind this machine's
HISTOGRAMS_KEPT = 2000  # per (layer, kind); a longer history keeps every other one


class RunState:
    def __init__(self, run: RunDir):
        self.run = run
        self.state = "starting"
        self.message = ""
        self.ended = False
        self.awaiting_start = False  # a new segment (resume, continue) was launched and has not started yet
        self._awaiting_since = 0.0  # when it was launched: a run_start from before is an earlier segment's
        self._held_end: dict = {}  # a run_end read while awaiting (an earlier segment's, or a refused launch's)
        self.segments = 0  # run_start events seen: a resumed or continued run has several
        self.epoch_events: list[dict] = []  # of the segments kept (a superseded attempt's are dropped)
        self.start_event: dict = {}
        self.last_prepare: dict = {}
        self.last_epoch: dict = {}
        self.best_epoch: dict = {}
        self.test_event: dict = {}  # data.test_dir evaluated at the end
        self.last_step: dict = {}
        self.end_event: dict = {}  # the run_end of the launch followed (epochs_completed, reason)
        self.seconds_per_step: float | None = None  # measured between the last two step events
        self.layer_table: dict = {}
        self.layers: list[str] = []
        self.group_names: list[str] = []
        self.warnings: list[dict] = []
        self.replans: list[dict] = []  # train.replan's re-plans of this segment, oldest first
        self.restarts: list[dict] = []  # the run's restarts (a requeued SLURM job, torchrun's restarts), oldest first
        self.errors: list[dict] = []
        self.histograms: dict[tuple[str, str], list[dict]] = {}  # (layer, kind) -> events, oldest first
        self.step_loss = Series()
        self.grad_norm = Series()
        self.images_per_s = Series()
        self.train_loss = Series()
        self.val_loss = Series()
        self.val_score = Series()  # val_acc, or a multi-label run's val_map (`score_key`)
        self.score_key = "val_acc"
        self.lr: list[Series] = []
        self.layer_grad: Matrix | None = None
        self.cpu = Series()
        self.memory = Series()
        self._eta_origin: tuple[float, float] | None = None  # (fraction done, time) when progress was first seen
        self.eta_s: float | None = None

    @property
    def epochs(self) -> int:
        """The run's epochs: as configured, or as train.replan last re-planned them."""
        if self.replans:
            return self.replans[-1]["epochs"]
        return self.start_event.get("config", {}).get("train", {}).get("epochs", 0)

    def apply(self, e: dict, now: float | None = None) -> str | None:
        """Take in one event; the kind of change ('preparing', 'runStarted', 'stepLogged', 'epochEnded',
        'warningRaised', 'errorRaised', 'systemSampled', 'tested', 'finished') or None when nothing a view shows changed.
        An event that is not what docs/events.md says (a broken mirror, a hand-edited file) is logged and skipped."""
        if not isinstance(e, dict):
            log.warning("%s: skipping an event that is not an object: %.80r", self.run.events, e)
            return None
        try:
            return self._apply(e, now)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            log.warning("%s: skipping a malformed %s event (%s): %.200r", self.run.events, e.get("event"), error, e)
            return None

    def _apply(self, e: dict, now: float | None) -> str | None:
        handler = self._HANDLERS.get(e.get("event"))
        return handler(self, e, now) if handler is not None else None

    def _on_prepare(self, e: dict, now: float | None) -> str:
        self.last_prepare = e
        return "preparing"

    def _on_run_start(self, e: dict, now: float | None) -> str:
        if self.awaiting_start and e.get("time", 0) >= self._awaiting_since - CLOCK_SLACK_S:
            self.awaiting_start = False
        self.ended = False
        self.state, self.message = ("starting" if self.awaiting_start else "running"), ""
        self.segments += 1
        if self.segments > 1:
            self._drop_superseded(e.get("start_step") or 0, e.get("start_epoch") or 0)
        self.start_event = e
        self.replans = []
        self.group_names = [g["name"] for g in e.get("param_groups", [])]
        while len(self.lr) < len(self.group_names):
            self.lr.append(Series())
        if e.get("layers") and (self.layer_grad is None or self.layer_grad.rows != len(e["layers"])):
            self.layers = e["layers"]
            self.layer_grad = Matrix(len(self.layers))
        self._eta_origin, self.eta_s = None, None
        return "runStarted"

    def _on_step(self, e: dict, now: float | None) -> str:
        step = e["step"]
        before = self.last_step
        if before and step > before.get("step", step) and e.get("time") and before.get("time"):
            self.seconds_per_step = (e["time"] - before["time"]) / (step - before["step"])
        self.last_step = e
        self.step_loss.append(step, e.get("loss"))
        self.images_per_s.append(step, e.get("images_per_s"))
        if e.get("grad_norm") is not None:
            self.grad_norm.append(step, e["grad_norm"])
        for series, lr in zip(self.lr, e.get("lr", [])):
            series.append(step, lr)
        self._update_eta(e, now)
        return "stepLogged"

    def _on_grad_stats(self, e: dict, now: float | None) -> None:
        self.layer_table = e
        if self.layer_grad is not None and len(e.get("grad_norm", [])) == self.layer_grad.rows:
            self.layer_grad.append(e["step"], e["grad_norm"])
        return None

    def _on_histogram(self, e: dict, now: float | None) -> None:
        series = self.histograms.setdefault((e["layer"], e["kind"]), [])
        series.append(e)
        if len(series) > HISTOGRAMS_KEPT:
            del series[::2]
        return None

    def _on_epoch(self, e: dict, now: float | None) -> str:
        self.last_epoch = e
        self.epoch_events.append(e)
        if "val_map" in e:  # multi-label: the best epoch is chosen by mAP, and that is the curve
            self.score_key = "val_map"
        key = self.score_key
        if not self.best_epoch or (e.get(key) or 0) > (self.best_epoch.get(key) or 0):
            self.best_epoch = e
        self.train_loss.append(e["epoch"], e.get("train_loss"))
        self.val_loss.append(e["epoch"], e.get("val_loss"))
        self.val_score.append(e["epoch"], e.get(key))
        self._update_eta(e, now)
        return "epochEnded"

    def _on_test(self, e: dict, now: float | None) -> str:
        self.test_event = e
        return "tested"

    def _on_system(self, e: dict, now: float | None) -> str:
        t = e.get("time", 0.0)
        self.cpu.append(t, e.get("cpu_percent"))
        self.memory.append(t, e.get("rss_mb"))
        return "systemSampled"

    def _on_replan(self, e: dict, now: float | None) -> str:
        self.replans.append(e)
        self._eta_origin, self.eta_s = None, None  # the pace is measured afresh against the new length
        return "replanned"

    def _on_restart(self, e: dict, now: float | None) -> str:
        self.restarts.append(e)
        return "restarted"

    def _on_warning(self, e: dict, now: float | None) -> str:
        self.warnings.append(e)
        return "warningRaised"

    def _on_error(self, e: dict, now: float | None) -> str:
        self.errors.append(e)
        return "errorRaised"

    def _on_run_end(self, e: dict, now: float | None) -> str | None:
        if self.awaiting_start:  # not the launch being followed: it has not started yet
            self._held_end = e
            return None
        self.end_event = e
        self.finish(e.get("status", "failed"), e.get("message", ""))
        return "finished"

    # event -> handler (the others, checkpoint and export, change nothing a view shows); every name is an EVENT_TYPE
    _HANDLERS = {"prepare": _on_prepare, "run_start": _on_run_start, "step": _on_step, "grad_stats": _on_grad_stats,
                 "histogram": _on_histogram, "epoch": _on_epoch, "test": _on_test, "system": _on_system,
                 "replan": _on_replan, "restart": _on_restart, "warning": _on_warning, "error": _on_error,
                 "run_end": _on_run_end}

    def stop_grace_s(self, floor_s: float) -> float:
        """How long Stop waits before it kills: the floor plus a few of this run's steps as measured now (a DDP
        step on a busy machine can take many seconds), capped."""
        return min(STOP_GRACE_CAP_S, floor_s + STOP_GRACE_STEPS * (self.seconds_per_step or 0.0))

    def expect_segment(self, since: float | None = None) -> None:
        """A resume or continue of this run was launched (at `since`): follow it; its run_start is the first one
        written after the launch, and the run_end of an earlier segment read before it does not end the run here."""
        self.ended, self.awaiting_start = False, True
        self._awaiting_since = time.time() if since is None else since
        self._held_end = {}
        self.state, self.message = "starting", ""
        self.eta_s = None

    def launch_ended(self, code: int) -> bool:
        """The process of a launched segment ended; when it never started the segment, end it here with the
        trainer's word (its run_end, or its status). True when that ended the run here."""
        if not self.awaiting_start:
            return False
        self.awaiting_start = False
        end = self._held_end
        if end and end.get("time", 0) >= self._awaiting_since - CLOCK_SLACK_S:
            self.end_event = end
            self.finish(end.get("status", "failed"), end.get("message", ""))
            return True
        if self.check_process():
            return True
        self.finish("failed", f"the trainer exited with code {code} before the run started again (see train.log)")
        return True

    def _drop_superseded(self, step: int, epoch: int) -> None:
        """A segment restarts from its checkpoint at (step, epoch): what an earlier attempt logged after that point
        was discarded by the trainer, and goes from the curves, the counters and the best epoch here too."""
        for series in (self.step_loss, self.grad_norm, self.images_per_s, *self.lr):
            series.truncate(step)
        for series in (self.train_loss, self.val_loss, self.val_score):
            series.truncate(epoch)
        if self.layer_grad is not None:
            self.layer_grad.truncate(step)
        for key, events in self.histograms.items():
            self.histograms[key] = [h for h in events if h.get("step", 0) <= step]
        self.epoch_events = [e for e in self.epoch_events if e["epoch"] <= epoch]
        self.last_epoch = self.epoch_events[-1] if self.epoch_events else {}
        self.best_epoch = max(self.epoch_events, key=lambda e: e.get(self.score_key) or 0, default={})
        self.last_step = {}
        self.test_event = {}

    def finish(self, state: str, message: str) -> None:
        self.ended = True
        self.state, self.message = state, message
        self.eta_s = None

    def final_progress(self) -> tuple[int, int, str]:
        """An ended run's (epochs trained, epochs planned, why it ended before them: '' when it did not): an early
        stop at 61 of 97 is 61 of 97, not 97 of 97."""
        done = self.end_event.get("epochs_completed", self.last_epoch.get("epoch", 0)) or 0
        reason = {"early_stop": "stopped early", "budget": "budget spent"}.get(self.end_event.get("reason") or "", "")
        epochs = max(self.epochs, done)
        return done, epochs, reason if done < epochs else ""

    def epochs_done(self, e: dict) -> float:
        """How many epochs a step or epoch event says are done (fractional within an epoch)."""
        if e.get("event") == "epoch":
            return float(e["epoch"])
        return e["epoch"] - 1 + e.get("batch", 0) / max(1, e.get("batches", 1))

    def _update_eta(self, e: dict, now: float | None) -> None:
        """Remaining time from the pace since progress was first seen (a resumed run starts part-way)."""
        epochs = self.epochs
        if not epochs:
            return
        now = time.time() if now is None else now
        fraction = self.epochs_done(e) / epochs
        if self._eta_origin is None:
            self._eta_origin = (fraction, now)
        elif fraction > self._eta_origin[0]:
            pace = (now - self._eta_origin[1]) / (fraction - self._eta_origin[0])
            self.eta_s = max(0.0, pace * (1 - fraction))

    def check_process(self) -> bool:
        """For a run with no run_end event: notice from status.json and its pid that the trainer is gone.
        True when that ended the run here."""
        if self.ended or self.awaiting_start:
            return False
        state = self.run.effective_state()
        if state not in FINAL_STATES:
            return False
        status = self.run.read_status()
        message = status.get("message") or "the trainer process ended without reporting (killed?)"
        if status.get("state") in LIVE_STATES:
            message = "the trainer process is gone (killed or crashed); resume continues from the last checkpoint"
        self.finish(state, message)
        return True

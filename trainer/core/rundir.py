"""The run directory: the unit of history shared by the trainer, the CLI and the app.

Torch-free. Layout:
    config.yaml     fully resolved config
    events.jsonl    event stream (docs/events.md)
    events.summary.jsonl  its summary: every event that describes the run, the frequent ones thinned
    status.json     {state, pid, message, epoch, step, best_acc, ...}, replaced atomically
    train.log       human log
    output.log      the trainer's stdout/stderr when launched by the app
    checkpoints/    last.pt, best.pt and numbered checkpoints
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.core.errors import InputError, first_line
from trainer.core.files import UserFileError, atomic_write_text, open_regular, read_user_file
from trainer.core.summary import summary_path
from trainer.core.system import open_by, pid_alive, try_lock, user_dir

STATES = ("queued", "starting", "running", "completed", "stopped", "preempted", "failed", "diverged")
# preempted: SLURM warned of the job's time limit or preemption, the run checkpointed and ended; its job requeues
# itself and goes on in the same run directory (device.requeue_limit times at most), or it can be resumed
FINAL_STATES = ("completed", "stopped", "preempted", "failed", "diverged")
LIVE_STATES = ("starting", "running")
UNFINISHED_STATES = ("queued", *LIVE_STATES)  # waiting or going: no end, no duration yet
RESUMABLE_STATES = ("stopped", "preempted", "failed")
FAILED_STATES = ("failed", "diverged")  # ended by an error: the user is told at once, with the log
EXIT_PREEMPTED = 4  # `main.py train`'s exit code for a run that ended preempted: its SLURM job requeues itself


# status.json's `reason` for how a run ended, in words (the Runs and Queue pages show them beside the state)
ENDINGS = {"budget": "train.budget spent", "early_stop": "early stop", "pruned": "pruned by the sweep",
           "forced": "forced", "too_slow": "too slow for its budget",
           "too_fast": "faster than measured"}


EVENTS_FILE, STATUS_FILE = "events.jsonl", "status.json"  # a run folder's (RunDir.events, RunDir.status_file)
METRICS_FILE, PREDICTIONS_FILE = "metrics.json", "predictions.csv"  # each evaluation's, in RUN/eval/NAME/
BEST_CHECKPOINT = "best.pt"  # in RUN/checkpoints/
MAX_STATUS_BYTES = 1 << 20  # status.json: a few hundred bytes; a remote run's, a few kB
NUMBER = (int, float)
STATUS_FIELDS: dict[str, tuple[type, ...]] = {  # what readers format or compare: a field of another kind is damage
    "state": (str,), "reason": (str,), "message": (str,), "pid": (int,), "epoch": (int,), "epochs": (int,),
    "step": (int,), "exit_code": (int,), "best_acc": NUMBER, "updated": NUMBER, "started": NUMBER, "ended": NUMBER,
    "remote": (dict,), "queue": (dict,), "model": (str,), "pgid": (int,), "worker_pid": (int,), "test_acc": NUMBER,
    "fit_epochs": (int,), "requeues": (int,), "requeue_lost_s": NUMBER,
    "test_map": NUMBER}
QUEUE_FIELDS: dict[str, tuple[type, ...]] = {"position": NUMBER, "added": NUMBER, "held": (bool,), "sweep": (str,),
                                             "values": (dict,), "gpus": (list,)}


def _wrong_field(record: dict, fields: dict[str, tuple[type, ...]]) -> str | None:
    """The first field of `record` whose value is not of its declared kinds (None when all are)."""
    for key, kinds in fields.items():
        value = record.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
            return f"{key} is {type(value).__name__} {str(value)[:40]!r}"
    return None


MAX_RUN_JSON_BYTES = 128 << 20  # a run's own JSON (metrics.json with a 1,000-class confusion matrix: about 10 MB)


def read_run_json(path: str | os.PathLike, what: str = "run file") -> Any:
    """A JSON file of a run folder (an evaluation's metrics.json, auto.json): a regular file of the run's own,
    bounded; OSError (UserFileError) or ValueError when it is not that."""
    return json.loads(read_user_file(path, MAX_RUN_JSON_BYTES, what, follow_links=False))


def damaged(why: str) -> dict[str, Any]:
    """The status of a run whose own files cannot be trusted, with the reason."""
    return {"state": "damaged", "damaged": why, "message": f"damaged: {why}"}


def state_text(state: str, reason: str | None, requeues: int | None = None, lost_s: float | None = None) -> str:
    """`completed (train.budget spent)`, `stopped (forced)`, or the state alone; a run whose SLURM job was requeued
    says how often and the time it lost waiting: `running · requeued 2×, 3.5 min lost`."""
    text = f"{state} ({ENDINGS.get(reason, str(reason).replace('_', ' '))})" if reason else state
    if requeues:
        lost = f", {lost_s / 60:.1f} min lost" if isinstance(lost_s, (int, float)) else ""
        text += f" · requeued {requeues}×{lost}"
    return text


class RunDirInUse(InputError, RuntimeError):
    """Another process is training in this run directory."""


class RunDirUsed(InputError, RuntimeError):
    """The run directory already holds a run (training into it again would overwrite it)."""


class RunDirDeleted(FileNotFoundError):
    """The run's directory went while the run was going (noticed where the message says)."""

    def __init__(self, path: Path, epoch: int, step: int):
        super().__init__(f"the run directory {path} was deleted while the run was going (noticed at epoch {epoch}, "
                         f"step {step}); nothing more could be saved")


@dataclass
class RunDir:
    path: Path

    def __post_init__(self):
        # absolute from the start: a relative run directory (--run-dir rel/M1, --runs-dir runs) made the paths
        # written into its config (its exclude.yaml) resolve against the run directory a second time
        self.path = Path(os.path.abspath(os.path.expanduser(self.path)))

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def evaluations(self) -> Path:
        """RUN_DIR/eval: one folder per evaluation (val, test, an evaluated folder), each with metrics.json and
        predictions.csv (docs/events.md)."""
        return self.path / "eval"

    def evaluation(self, name: str) -> Path:
        """RUN_DIR/eval/NAME."""
        return self.evaluations / name

    def metrics_file(self, name: str) -> Path:
        """An evaluation's figures (RUN_DIR/eval/NAME/metrics.json)."""
        return metrics_file(self.evaluation(name))

    def predictions_file(self, name: str) -> Path:
        """An evaluation's per-image predictions (RUN_DIR/eval/NAME/predictions.csv)."""
        return predictions_file(self.evaluation(name))

    @property
    def auto_choices(self) -> Path:
        """What Auto chose for this run and why (`main.py auto`; JSON: {"choices": [{key, value, why}]})."""
        return self.path / "auto.json"

    @property
    def manifest(self) -> Path:
        """The run's own copy of the data.exclude manifest it trained with."""
        return self.path / "exclude.yaml"

    @property
    def events(self) -> Path:
        return self.path / EVENTS_FILE

    @property
    def mlflow(self) -> Path:
        """The MLflow run this run logs into (`monitor.mlflow`; JSON: tracking_uri, experiment, experiment_id,
        run_id)."""
        return self.path / "mlflow.json"

    def mlflow_run(self) -> dict:
        """mlflow.json's record ({} when the run logs to no MLflow run, or the file cannot be read)."""
        if not os.path.lexists(self.mlflow):
            return {}
        try:
            kept = json.loads(read_user_file(self.mlflow, MAX_STATUS_BYTES, "MLflow record", follow_links=False))
        except (UserFileError, ValueError):
            return {}
        fields = ("tracking_uri", "experiment", "experiment_id", "run_id")
        return kept if isinstance(kept, dict) and all(isinstance(kept.get(k, ""), str) for k in fields) else {}

    def mlflow_page(self) -> str:
        """The address of this run's page in the MLflow UI of the tracking server it logs to; "" when it logs to none,
        or to a store that no server shows (a file: or sqlite: URI)."""
        kept = self.mlflow_run()
        try:
            uri, experiment, run = kept["tracking_uri"], kept["experiment_id"], kept["run_id"]
        except KeyError:
            return ""
        if not isinstance(uri, str) or not uri.startswith(("http://", "https://")):
            return ""
        return f"{uri.rstrip('/')}/#/experiments/{experiment}/runs/{run}"

    @property
    def summary(self) -> Path:
        """events.jsonl's summary (`trainer.core.summary`): what opening, comparing or resuming a run reads."""
        return summary_path(self.events)

    def first_event(self, name: str, within_bytes: int = 4 << 20) -> dict | None:
        """The first `name` event in the first `within_bytes` of the event file (None if not there): a long run's
        file is never read whole for it."""
        from trainer.core.events import EventTail

        tail = EventTail(self.events)
        while tail.offset < within_bytes and not tail.at_end:
            found = next((e for e in tail.read_new(256 << 10) if e["event"] == name), None)
            if found is not None:
                return found
        return None

    def last_events(self, *names: str) -> dict[str, dict]:
        """The last event of each of `names` in the run's events ({} for one not there): read from the file's end
        (`last_events_in`), a long run's file is never parsed whole for them, summary or not."""
        from trainer.core.events import last_events_in

        return last_events_in(self.events, names)

    def settings(self):
        """The run's config as settings for another run: config.yaml holds what the trainer decided for the run's
        data (`auto` values, listed in run_start's `augment`); those go back to auto, to be decided for the data the
        next run trains on."""
        from trainer.core.config import load_config

        cfg = load_config(self.config)
        decided = [choice["key"] for choice in (self.first_event("run_start") or {}).get("augment") or []]
        return cfg.with_overrides([f"{key}=auto" for key in decided]) if decided else cfg

    @property
    def status_file(self) -> Path:
        return self.path / STATUS_FILE

    @property
    def log(self) -> Path:
        return self.path / "train.log"

    @property
    def output_log(self) -> Path:
        return self.path / "output.log"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def best_checkpoint(self) -> Path:
        """The best epoch's checkpoint (a link the checkpoint writer keeps)."""
        return self.checkpoints / BEST_CHECKPOINT

    @property
    def exports(self) -> Path:
        """Where the run's exports go unless the user chooses another folder."""
        return self.path / "exports"

    @property
    def name(self) -> str:
        return self.path.name

    def create(self) -> RunDir:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        return self

    def read_status(self) -> dict[str, Any]:
        """status.json's fields ({} when there is none yet). A run folder is user input (a colleague's, a copy, a
        crash): a status that is not a regular file of the run's own (a link, a FIFO, a device), larger than a status
        can be, not a JSON object, or with a field of the wrong kind is `damaged`: {"state": "damaged", "damaged":
        why}, which no command trains, the queue passes over and the app shows read-only."""
        if not os.path.lexists(self.status_file):
            return {}
        try:
            status = json.loads(read_user_file(self.status_file, MAX_STATUS_BYTES, "status file", follow_links=False))
        except UserFileError as e:
            return damaged(str(e))
        except (ValueError, UnicodeDecodeError) as e:
            return damaged(f"{self.status_file}: not JSON ({first_line(e, 120)})")
        if not isinstance(status, dict):
            return damaged(f"{self.status_file}: a JSON {type(status).__name__}, not an object")
        wrong = _wrong_field(status, STATUS_FIELDS) or _wrong_field(status.get("queue") or {}, QUEUE_FIELDS)
        if wrong:
            return damaged(f"{self.status_file}: {wrong}")
        return status

    def damage(self) -> str:
        """Why this run's own files cannot be trusted ("" when they can): status.json damaged (`read_status`), or an
        events file or summary that is not a regular file of the run's own (a FIFO would hang its reader, a link
        would read or write another run's)."""
        status = self.read_status()
        if status.get("state") == "damaged":
            return status["damaged"]
        for path, what in ((self.events, "events file"), (self.summary, "summary of events")):
            if os.path.lexists(path):
                try:
                    os.close(open_regular(path, what, follow_links=False))
                except UserFileError as e:
                    return str(e)
        return ""

    def write_status(self, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into status.json, atomically (readers never see a half-written file).

        On a full disk the new file cannot be made: the old one is then overwritten in place (its blocks are
        reused), so a run's end is still recorded; only when that fails too does the OSError propagate.
        """
        status = self.read_status()
        if status.get("state") == "damaged":
            status = {}  # written anew, nothing kept of what could not be read
        status.update(fields)
        status["updated"] = time.time()
        text = json.dumps(status, indent=1)
        try:
            atomic_write_text(self.status_file, text)
        except OSError:
            if not self.status_file.exists():
                raise
            with open(self.status_file, "r+", encoding="utf-8") as f:
                f.write(text)
                f.truncate()
        return status

    @property
    def is_remote(self) -> bool:
        """A mirror of a run on a host (trainer/remote/mirror.py)."""
        return (self.path / "remote.json").exists()

    @staticmethod
    def _process_alive(status: dict) -> bool:
        """The trainer's liveness: its pid here, or for a mirror what the host said last (its pid is the host's)."""
        if "remote" in status:
            return bool(status["remote"].get("alive"))
        return pid_alive(status.get("pid"))

    def effective_state(self) -> str:
        """The state, with a 'running' run whose process is gone reported as failed."""
        status = self.read_status()
        state = status.get("state", "unknown")
        if state in LIVE_STATES and not self._process_alive(status):
            return "failed"
        return state

    def record_forced_stop(self, grace_s: float) -> bool:
        """After Stop, the trainer did not end within `grace_s` and was killed: the run is stopped (forced), not
        crashed. False when the trainer had recorded an end of its own."""
        if self.read_status().get("state") not in LIVE_STATES:
            return False
        self.write_status(state="stopped", reason="forced", ended=time.time(),
                          message=f"stopped (forced): the trainer did not stop within {grace_s:.0f} s of Stop and was "
                                  f"killed; resume continues from the last checkpoint")
        return True

    def is_live(self) -> bool:
        """Whether a process is training in this run directory right now (for a mirror: as the host said last)."""
        status = self.read_status()
        return status.get("state") in LIVE_STATES and self._process_alive(status)

    def awaits_requeue(self) -> bool:
        """A mirror of a run that ended preempted whose SLURM job is still queued or running (as the host said last):
        it goes on in this run when the job starts again."""
        status = self.read_status()
        return status.get("state") == "preempted" and bool(((status.get("remote") or {}).get("job") or {}).get("active"))

    def holds_a_run(self) -> bool:
        """Whether a run has already trained here (status, events or checkpoints exist)."""
        return self.status_file.exists() or self.events.exists() or any(self.checkpoints.glob("*.pt"))

    def lock(self):
        """An exclusive lock held for the life of a launch (released by the OS if the process dies).

        Taken before anything in the directory is written, so two launches into one directory never mix.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        handle = try_lock(self.path / ".lock")
        if handle is None:  # named by the process that holds the lock, not by what status.json says
            holders = open_by(self.path / ".lock")
            who = f" (pid {', '.join(map(str, holders))})" if holders else ""
            raise RunDirInUse(f"{self.path}: in use by another run{who}; wait for it or stop it") from None
        return handle

    def clear_for_new_run(self) -> None:
        """Remove what an earlier run left here (events, status, checkpoints, logs) before training anew."""
        for path in (self.events, self.summary, self.status_file, self.log, self.output_log, self.config,
                     self.manifest):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        self.clear_rank_errors()

    # ---- errors of ranks other than 0 (they write no events) ---------------------------------
    def write_rank_error(self, rank: int, message: str) -> None:
        """Ranks other than 0 cannot write events; the launcher reads this file to name them."""
        if rank == 0:
            return
        try:
            (self.path / f"rank-{rank}.error").write_text(f"rank {rank}: {message}\n", encoding="utf-8")
        except OSError:
            pass

    def note_dead_rank(self, rank: int, exit_code: int) -> None:
        """A rank that died without a word (killed): recorded for it, unless it wrote its own error."""
        path = self.path / f"rank-{rank}.error"
        if path.exists():
            return
        import signal

        how = f"killed by signal {signal.Signals(-exit_code).name}" if exit_code < 0 else f"exited with code {exit_code}"
        path.write_text(f"rank {rank} died ({how}); the other ranks were stopped\n", encoding="utf-8")

    def rank_errors(self) -> list[str]:
        return [p.read_text(encoding="utf-8").strip() for p in sorted(self.path.glob("rank-*.error"))]

    def clear_rank_errors(self) -> None:
        for stale in self.path.glob("rank-*.error"):
            stale.unlink(missing_ok=True)

    def tail_log(self, lines: int = 20) -> str:
        for path in (self.log, self.output_log):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - 16384))
                    text = f.read().decode("utf-8", "replace")
                if text.strip():
                    return "\n".join(text.splitlines()[-lines:])
            except OSError:
                continue
        return ""


def report_end(run: RunDir, code: int) -> int:
    """The last line of `main.py train`/`resume` (here or through a host): how the run ended and where; the exit
    code, passed through."""
    if not run.path.is_dir():
        print(f"run failed: the run directory {run.path} was deleted while the run was going", file=sys.stderr)
        return code
    status = run.read_status()
    state = status.get("state", "unknown")
    best = status.get("best_acc")
    metric = status.get("best_metric") or "val_acc"  # multi-label runs are chosen by val_map
    tail = f", best {metric} {100 * best:.1f}%" if isinstance(best, (int, float)) else ""
    line = f"run {state}{tail}: {run.path}"
    if status.get("message") and state != "completed":
        line += f"\nreason: {status['message']}"
    print(line, file=sys.stderr if code else sys.stdout, flush=True)
    return code


def run_label(model_name: str) -> str:
    """The label a run directory's name ends with: the model's name (`timm:convnext_tiny` -> convnext_tiny,
    `nets/mine.py:Net` -> mine)."""
    return Path(model_name.split(":")[-1]).stem


def planned_run_dir(runs_dir: str | os.PathLike, label: str) -> RunDir:
    """A uniquely named run directory under runs_dir that does not exist yet (not created)."""
    runs_dir = Path(runs_dir)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)[:40] or "run"
    for i in range(1000):
        path = runs_dir / (f"{stamp}-{safe}" + (f"-{i}" if i else ""))
        if not path.exists():
            return RunDir(path)
    raise RuntimeError(f"{runs_dir}: could not find a free run directory name")


def configs_folder(runs_dir: str | os.PathLike) -> Path:
    """RUNS/configs: the configs the app writes (Command, Add to queue, sweeps, the LR finder, manifests)."""
    return Path(runs_dir) / "configs"


def pending_folder(runs_dir: str | os.PathLike) -> Path:
    """RUNS/.pending: a started run's config and output while the trainer makes its directory."""
    return Path(runs_dir) / ".pending"


def metrics_file(evaluation: Path) -> Path:
    return evaluation / METRICS_FILE


def predictions_file(evaluation: Path) -> Path:
    return evaluation / PREDICTIONS_FILE


def new_config_file(runs_dir: str | os.PathLike, prefix: str = "config") -> Path:
    """A new, unused file name for a config the app writes (what Command, Add to queue, a sweep or the LR finder
    start from): RUNS/configs/PREFIX-TIME[-N].yaml, reserved (two writers in one second never share one)."""
    folder = configs_folder(runs_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = folder / (f"{prefix}-{stamp}.yaml" if n == 0 else f"{prefix}-{stamp}-{n + 1}.yaml")
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            continue
    raise RuntimeError(f"{folder}: no free config file name")


def new_run_dir(runs_dir: str | os.PathLike, label: str) -> RunDir:
    """A fresh, uniquely named run directory under runs_dir (created; two callers never get the same one)."""
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    for _ in range(1000):
        run = planned_run_dir(runs_dir, label)
        try:
            run.path.mkdir()
        except FileExistsError:
            continue
        return run.create()
    raise RuntimeError(f"{runs_dir}: could not create a new run directory")


def list_runs(runs_dir: str | os.PathLike, remote: bool = False) -> list[RunDir]:
    """Run directories under runs_dir, newest first; with `remote`, the mirrors of runs on hosts too
    (runs_dir/remote/HOST/NAME, trainer/remote/mirror.py), which the queue never sees."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    folders = [runs_dir]
    if remote and (runs_dir / "remote").is_dir():
        folders += [p for p in (runs_dir / "remote").iterdir() if p.is_dir()]
    runs = [RunDir(p) for folder in folders for p in folder.iterdir() if is_run_folder(p)]
    return sorted(runs, key=lambda r: r.path.stat().st_mtime, reverse=True)


def is_run_folder(path: Path) -> bool:
    """Whether a folder of a runs folder is a run (its config written, or a mirror's remote.json), as the lists say."""
    return path.is_dir() and ((path / "config.yaml").exists() or (path / "remote.json").exists())


def user_log_dir() -> Path:
    """Where TrainDeck keeps logs that belong to no run (tracebacks of the command line)."""
    return user_dir("state")


def default_runs_dir() -> Path:
    """The command line's runs folder without --runs-dir: $TRAINDECK_RUNS, else ./runs where the command is run."""
    return Path(os.environ.get("TRAINDECK_RUNS", Path.cwd() / "runs"))


def user_runs_dir() -> Path:
    """The window's runs folder until the user chooses one: $TRAINDECK_RUNS, else runs/ in TrainDeck's data folder
    (beside the demo dataset; on Linux ~/.local/share/traindeck/runs), never the folder the app was started from."""
    return Path(os.environ.get("TRAINDECK_RUNS") or user_dir("data") / "runs")

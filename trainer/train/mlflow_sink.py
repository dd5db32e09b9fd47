"""The run logged to MLflow as well (`monitor.mlflow: URI`): its parameters (the whole config, flattened), the step
and epoch metrics, the confusion matrix, the evaluations, the exports and their model cards; the run's end as the
MLflow run's status.

A sink of the event stream, fed by the reporter on rank 0, like TensorBoard's. Nothing here blocks a step: the events
go into a queue that a thread of its own sends to the tracking server (metrics in batches). A server that cannot be
reached costs the run nothing but the log: the first failure is written to train.log and the sink stops sending. The
MLflow run's id is kept in RUN/mlflow.json, so a resumed run goes on logging into the same MLflow run.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
from pathlib import Path

from trainer.core.errors import first_line
from trainer.core.files import atomic_write_text
from trainer.core.rundir import RunDir

log = logging.getLogger("trainer")

EVENTS = ("run_start", "step", "epoch", "test", "export", "run_end")
# anything else (failed, diverged, made way...) FAILED
STATUS = {"completed": "FINISHED", "stopped": "KILLED", "preempted": "KILLED"}
BOOKKEEPING = {"event", "v", "time", "epoch", "epochs", "step", "image_size", "seconds", "images"}  # not metrics
CLOSE_WAIT_S = 120.0  # the run's end waits this long at most for what is still being sent (artefacts)
BATCH = 1000  # MLflow's most metrics in one request
PARAM_BATCH = 100  # and parameters
PARAM_CHARS = 6000  # and a parameter value's length


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """`{"data": {"batch_size": 64}}` -> `{"data.batch_size": "64"}`; lists and None as their text."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:PARAM_CHARS]
    return out


def metrics_of(record: dict) -> dict[str, float]:
    """The numbers an event carries as MLflow metrics: a step's loss, learning rates and gradient norm; an epoch's
    losses and scores (val_acc, val_map, ...); the test set's."""
    kind = record["event"]
    if kind == "step":
        out = {"loss": record.get("loss"), "grad_norm": record.get("grad_norm"),
               "images_per_s": record.get("images_per_s")}
        out |= {f"lr_group{i}": lr for i, lr in enumerate(record.get("lr") or [])}
    elif kind == "epoch":
        out = {k: v for k, v in record.items() if k not in BOOKKEEPING}
        out |= {f"epoch_lr_group{i}": lr for i, lr in enumerate(record.get("lr") or [])}
    elif kind == "test":
        out = {f"test_{k}": v for k, v in record.items() if k not in BOOKKEEPING}
    else:
        out = {}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class MLflowSink:
    """Events in, MLflow calls out on a thread of its own (see the module's docstring)."""

    def __init__(self, run_path: Path, uri: str, experiment: str):
        self.run_path = Path(run_path)
        self.uri = uri
        self.experiment = experiment
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.client = None
        self.run_id = ""
        self.failed = ""  # the first failure's text: nothing more is sent

    def __call__(self, record: dict) -> None:
        if record["event"] not in EVENTS:
            return
        if self.thread is None:
            if record["event"] != "run_start":
                return
            self.thread = threading.Thread(target=self._work, name="mlflow", daemon=True)
            self.thread.start()
        self.queue.put(record)

    def close(self) -> None:
        """Waits (CLOSE_WAIT_S at most) for what was queued to be sent."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join(CLOSE_WAIT_S)
            if self.thread.is_alive():
                log.warning("mlflow: still sending after %.0f s at the run's end; the rest is not logged",
                            CLOSE_WAIT_S)
            self.thread = None

    # ---- the sending thread ----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            records = [self.queue.get()]
            while records[-1] is not None:  # everything already waiting: its metrics go in one request
                try:
                    records.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            done = records[-1] is None
            if not self.failed:
                try:
                    self._send([r for r in records if r is not None])
                except Exception as e:  # noqa: BLE001 - the run goes on without MLflow, said once in the log
                    self.failed = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    log.warning("mlflow: cannot log to %s (%s); the run goes on without it", self.uri, self.failed)
            if done:
                return

    def _send(self, records: list[dict]) -> None:
        from mlflow.entities import Metric

        pending: list = []
        for record in records:
            kind = record["event"]
            if kind == "run_start":
                self._start(record)
            step = int(record.get("step") or 0)
            pending += [Metric(k, v, int(record.get("time", 0) * 1000), step) for k, v in metrics_of(record).items()]
            if kind in ("test", "export", "run_end"):  # files to send: the metrics before them go first
                self._log_metrics(pending)
                pending = []
                self._files(record)
        self._log_metrics(pending)

    def _log_metrics(self, metrics: list) -> None:
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH], synchronous=True)

    def _start(self, record: dict) -> None:
        """The MLflow run: the one RUN/mlflow.json names (a resumed run), else a new one with the config as
        parameters."""
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # a server that is down: a warning soon,
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")  # not minutes of retries
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=None if self.uri == "env" else self.uri)
        kept = RunDir(self.run_path).mlflow_run()
        if kept.get("tracking_uri") == self.uri and kept.get("run_id") and self._ours(kept):
            self.run_id = kept["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self._create_run(record)

    def _ours(self, kept: dict) -> bool:
        """mlflow.json names this run's own MLflow record (its experiment, its name, its run folder's tag): a file
        edited by hand, or copied from another run, never makes a resumed run log into another run's record."""
        try:
            found = self.client.get_run(str(kept["run_id"]))
        except Exception as e:  # noqa: BLE001 - no such run there (deleted, another server): a new one
            log.warning("mlflow.json names MLflow run %s, which %s cannot give (%s): logging to a new run",
                        str(kept["run_id"])[:64], self.uri, first_line(e))
            return False
        ours = (found.info.experiment_id == str(kept.get("experiment_id")) and found.info.run_name == self.run_path.name
                and found.data.tags.get("traindeck.run_dir") == str(self.run_path))
        if not ours:
            log.warning("mlflow.json names MLflow run %s, which is not this run's (%s, of %s): logging to a new run",
                        str(kept["run_id"])[:64], found.info.run_name, found.data.tags.get("traindeck.run_dir"))
        return ours

    def _create_run(self, record: dict) -> None:
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(self.experiment)
        if experiment is None:
            try:
                experiment_id = self.client.create_experiment(self.experiment)
            except Exception:  # noqa: BLE001 - another run created it meanwhile
                experiment_id = self.client.get_experiment_by_name(self.experiment).experiment_id
        else:
            experiment_id = experiment.experiment_id
        config = record.get("config", {})
        run = self.client.create_run(experiment_id, run_name=self.run_path.name,
                                     tags={"traindeck.run_dir": str(self.run_path),
                                           "traindeck.model": str(config.get("model", {}).get("name", ""))})
        self.run_id = run.info.run_id
        atomic_write_text(RunDir(self.run_path).mlflow, json.dumps(
            {"tracking_uri": self.uri, "experiment": self.experiment, "experiment_id": experiment_id,
             "run_id": self.run_id}, indent=1))
        params = [Param(k, v) for k, v in flatten(config).items()]
        for i in range(0, len(params), PARAM_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + PARAM_BATCH], synchronous=True)

    def _files(self, record: dict) -> None:
        """A test set's evaluation folder, an export with its model card, or at the run's end the validation
        evaluation with its confusion matrix, and the MLflow run's status."""
        kind, client = record["event"], self.client
        if kind == "test":
            self._log_folder(Path(record["folder"]), "eval/test")
        elif kind == "export":
            export = Path(record["path"])
            for path in (export, Path(f"{export}.json"), Path(f"{export}.md")):
                if path.exists():
                    self._log_path(path, "exports")
        else:
            val = self.run_path / "eval" / "val"
            self._log_folder(val, "eval/val")
            with tempfile.TemporaryDirectory(prefix="traindeck-mlflow-") as tmp:
                figure = Path(tmp) / "confusion_matrix.png"
                if confusion_figure(val / "metrics.json", figure):
                    client.log_artifact(self.run_id, str(figure))
            client.set_terminated(self.run_id, STATUS.get(record.get("status"), "FAILED"))

    def _log_folder(self, folder: Path, artifact_path: str) -> None:
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path), artifact_path)

    def _log_path(self, path: Path, artifact_path: str) -> None:
        if path.is_dir():  # a Core ML package is a folder
            self.client.log_artifacts(self.run_id, str(path), f"{artifact_path}/{path.name}")
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)


def confusion_figure(metrics_file: Path, out: Path) -> bool:
    """The confusion matrix of an evaluation's metrics.json drawn as a PNG (matplotlib, which MLflow installs);
    whether it was (not for a multi-label evaluation, nor without matplotlib)."""
    try:
        metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except (OSError, ValueError, ImportError):
        return False
    matrix, classes = metrics.get("confusion"), metrics.get("classes")
    if not matrix or not classes:
        return False
    size = min(4 + 0.35 * len(classes), 20)
    figure, axes = plt.subplots(figsize=(size, size))
    axes.imshow(matrix, cmap="Blues")
    axes.set_xticks(range(len(classes)), classes, rotation=90)
    axes.set_yticks(range(len(classes)), classes)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"{metrics.get('accuracy', 0):.1%} of {metrics.get('images', '?')} validation images")
    if len(classes) <= 30:
        top = max(max(row) for row in matrix) or 1
        for i, row in enumerate(matrix):
            for j, n in enumerate(row):
                if n:
                    axes.text(j, i, str(n), ha="center", va="center", fontsize=8,
                              color="white" if n > top / 2 else "black")
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return True

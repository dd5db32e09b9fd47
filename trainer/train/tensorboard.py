"""TensorBoard event files beside the run's own events (`monitor.tensorboard: true`): `tensorboard --logdir runs`.

A sink of the event stream, fed by the reporter on rank 0: step and epoch scalars, gradient / weight histograms and
the run's hyper-parameters (HPARAMS tab). On resume the writer purges what the interrupted process logged after its
last checkpoint (TensorBoard's purge_step), so the curves stay continuous with no step written twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

FOLDER = "tensorboard"
METRICS = ("val/acc", "val/loss")
HPARAM_KEYS = ("model.name", "model.weights", "optimizer.name", "optimizer.lr", "optimizer.weight_decay",
               "data.batch_size", "data.image_size", "data.image_width", "train.epochs", "train.seed", "scheduler.name",
               "train.amp", "loss.label_smoothing")


class TensorBoardSink:
    """Turns events into TensorBoard summaries; created lazily at `run_start` (which says where to purge from)."""

    def __init__(self, run_path: Path):
        self.folder = Path(run_path) / FOLDER
        self.writer = None

    def __call__(self, record: dict) -> None:
        kind = record["event"]
        if kind == "run_start":
            self._open(record)
        if self.writer is None:
            return
        w = self.writer
        if kind == "step":
            step = record["step"]
            w.add_scalar("train/loss", record["loss"], step)
            for i, lr in enumerate(record.get("lr") or []):
                w.add_scalar(f"train/lr/group{i}", lr, step)
            if record.get("grad_norm") is not None:
                w.add_scalar("train/grad_norm", record["grad_norm"], step)
            w.add_scalar("train/images_per_s", record["images_per_s"], step)
        elif kind == "epoch":
            step = record["step"]
            for key, tag in (("val_acc", "val/acc"), ("val_loss", "val/loss"), ("train_loss", "train/epoch_loss"),
                             ("train_acc", "train/epoch_acc"), ("val_top5", "val/top5")):
                if record.get(key) is not None:
                    w.add_scalar(tag, record[key], step)
        elif kind == "histogram":
            self._histogram(record)
        elif kind == "run_end":
            self.close()

    def _open(self, record: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.close()
        purge = record["start_step"] + 1 if record.get("resumed_from") else None
        self.writer = SummaryWriter(str(self.folder), purge_step=purge)
        config = record.get("config", {})
        values = {}
        for key in HPARAM_KEYS:
            node = config
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            values[key] = node if isinstance(node, (int, float, str, bool)) else str(node)
        for summary in hparams(values, {m: 0.0 for m in METRICS}):  # declares the metrics; the values come as scalars
            self.writer.file_writer.add_summary(summary)

    def _histogram(self, record: dict) -> None:
        import numpy as np

        counts = np.asarray(record["counts"], dtype=float)
        edges = np.linspace(record["min"], record["max"], len(counts) + 1)
        centres = (edges[:-1] + edges[1:]) / 2
        self.writer.add_histogram_raw(
            f"{record['kind']}/{record['layer']}", min=record["min"], max=record["max"], num=int(counts.sum()),
            sum=float((counts * centres).sum()), sum_squares=float((counts * centres ** 2).sum()),
            bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(), global_step=record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

"""A run's curves as CSV, at the full resolution of its event stream (the plots show a thinned copy). Qt-free."""

from __future__ import annotations

from pathlib import Path

from trainer.core.csvfile import SafeWriter
from trainer.core.events import EventTail

STEP_COLUMNS = ("step", "epoch", "loss", "images_per_s", "grad_norm")
EPOCH_COLUMNS = ("epoch", "step", "train_loss", "train_acc", "val_loss", "val_acc", "seconds")


def export_run_csv(events_path: str | Path, out: str | Path) -> tuple[Path, Path]:
    """Write every step event to `out` and every epoch event to `out`-epochs.csv; both paths.

    Streams the events file, so a million-step run needs no more memory than a short one. The learning rate
    of each parameter group gets a column, named after the group.
    """
    out = Path(out)
    epochs_out = out.with_name(out.stem + "-epochs.csv")
    tail = EventTail(events_path)
    groups: list[str] = []
    with open(out, "w", newline="", encoding="utf-8") as steps_file, \
            open(epochs_out, "w", newline="", encoding="utf-8") as epochs_file:
        steps = SafeWriter(steps_file)  # a group named '=...' does not become a formula
        epochs = SafeWriter(epochs_file)
        epochs.writerow(EPOCH_COLUMNS)
        header_written = False
        while not tail.at_end:
            batch = tail.read_new()
            for e in batch:
                kind = e.get("event")
                if kind == "run_start" and not header_written:
                    groups = [g["name"] for g in e.get("param_groups", [])]
                elif kind == "step":
                    if not header_written:
                        groups = groups or [f"group{i}" for i in range(len(e.get("lr", [])))]
                        steps.writerow([*STEP_COLUMNS, *(f"lr_{g}" for g in groups)])
                        header_written = True
                    steps.writerow([_cell(e.get(c)) for c in STEP_COLUMNS] + [_cell(v) for v in e.get("lr", [])])
                elif kind == "epoch":
                    epochs.writerow([_cell(e.get(c)) for c in EPOCH_COLUMNS])
        if not header_written:
            steps.writerow([*STEP_COLUMNS, *(f"lr_{g}" for g in groups)])
    return out, epochs_out


def _cell(value) -> str | float | int:
    return "" if value is None else value

"""The end of a completed run, handed over by the engine: the test set evaluated once with best.pt, and the
`export.formats` exports, each with its event. An export that fails leaves the run completed, with a warning.

Below `train` in the layers: the reporter is any object with `prepare` and `emit` (the trainer's Reporter)."""

from __future__ import annotations

import logging
import traceback

from trainer.core.errors import first_line
from trainer.core.rundir import RunDir

log = logging.getLogger("trainer")
trace_log = logging.getLogger("trainer.trace")  # tracebacks: to train.log only, never to the console


def finish_run(run: RunDir, reporter, held_out: list[tuple[str, int]], cfg) -> None:
    """What a completed run does after training: its test set (data.test_dir or data.test_split), its exports."""
    if cfg.data.labels and (cfg.data.test_labels or held_out):
        evaluate_multilabel_test_set(run, reporter, held_out, cfg.data)
    elif cfg.data.test_dir or held_out:
        evaluate_test_set(run, reporter, held_out, cfg.data)
    export_formats(run, reporter, cfg.export.formats)


def evaluate_test_set(run: RunDir, reporter, held_out: list[tuple[str, int]], data) -> None:
    """data.test_dir (or the images data.test_split held out), once, with best.pt: eval/test/ and a `test` event
    (what the run summary shows)."""
    from trainer.deploy.evaluation import evaluate_run, evaluate_samples, summary
    from trainer.deploy.inference import load_run_model

    reporter.prepare("test", "evaluating the test set with best.pt")
    if data.test_dir:
        folder, metrics = evaluate_run(run.path, None, "best", overwrite=True)  # an extended run evaluates it again
    else:
        where = f"{data.train_dir} (data.test_split {data.test_split:g}: {len(held_out)} images held out)"
        metrics = evaluate_samples(run.path, load_run_model(run, "best"), held_out, "test", where)
        folder = run.evaluation("test")
    reporter.emit("test", folder=str(folder), per_class=metrics["per_class"], **summary(metrics))
    run.write_status(test_acc=metrics["accuracy"])  # the runs table's test column
    log.info("test set: accuracy %.1f%% on %d images (%s)", 100 * metrics["accuracy"], metrics["images"], folder)


def evaluate_multilabel_test_set(run: RunDir, reporter, held_out: list, data) -> None:
    """Multi-label: data.test_labels' images (or those data.test_split held out), once, with best.pt, scored at the
    thresholds validation chose: eval/test/ and a `test` event."""
    import torch

    from trainer.data.labels import labelled_scan
    from trainer.deploy.inference import classify, load_run_model
    from trainer.deploy.multilabel import write_multilabel_evaluation

    reporter.prepare("test", "evaluating the test set with best.pt")
    model = load_run_model(run, "best")
    if data.test_labels:
        samples, where = labelled_scan(data.test_labels, "data.test_labels", names=model.classes).samples, \
            data.test_labels
    else:
        samples = held_out
        where = f"{data.labels} (data.test_split {data.test_split:g}: {len(held_out)} images held out)"
    found = classify(model, [path for path, _ in samples])
    targets = torch.tensor([samples[i][1] for i in found.kept], dtype=torch.float32)
    skipped = [{"path": samples[i][0], "reason": r} for i, r in found.errors.items()]
    metrics = write_multilabel_evaluation(run.path, "test", found.paths, found.logits, targets, model.classes,
                                          model.thresholds, extra={"folder": where, "checkpoint": str(model.source),
                                                                   "epoch": model.state["epoch"], "skipped": skipped})
    folder = run.evaluation("test")
    reporter.emit("test", folder=str(folder), images=metrics["images"], map=metrics["map"],
                  map_micro=metrics["map_micro"], loss=metrics["loss"],
                  per_label={n: v["ap"] for n, v in metrics["per_label"].items()})
    run.write_status(test_map=metrics["map"])
    log.info("test set: mAP %.1f%% on %d images (%s)", 100 * (metrics["map"] or 0), metrics["images"], folder)


def export_formats(run: RunDir, reporter, formats: list[str]) -> None:
    """export.formats: best.pt into RUN_DIR/exports/model.EXT (+ its model card), each with an `export` event."""
    from trainer.core.catalog import EXPORT_FORMATS
    from trainer.deploy.export import export_run
    from trainer.deploy.model_card import read_card, summary

    for fmt in formats:
        reporter.prepare("export", f"exporting best.pt as {fmt}")
        try:
            path = export_run(run, fmt, run.path / "exports" / f"model{EXPORT_FORMATS[fmt]}")
        except Exception as e:  # noqa: BLE001 - the run trained: its checkpoints stand, the export can be redone
            message = (f"export as {fmt} failed ({first_line(e)}); the run and its checkpoints are kept: export it "
                       f"again with `main.py export {run.path} --format {fmt}`")
            log.warning("%s", message)
            trace_log.debug("%s", traceback.format_exc())
            reporter.emit("warning", kind="export_failed", message=message, format=fmt)
            continue
        card = read_card(path) or {}
        reporter.emit("export", format=fmt, path=str(path), bytes=card.get("file", {}).get("bytes"),
                      top1=(card.get("metrics") or {}).get("top1"), batch1_ms=(card.get("speed") or {}).get("batch1_ms"))
        log.info("exported best.pt as %s: %s (%s)", fmt, path, summary(card) if card else "no model card")

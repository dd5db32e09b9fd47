"""Exporting a run's checkpoint in formats other tools load, measuring what each file is worth, and predicting with
any of them.

Each export writes its model card beside it: `<out>.json` (model name, classes, image size, mean/std, source run and
checkpoint, so `predict` or any other program can preprocess images as training did; plus the measured numbers, the
training config and data counts, and how to load the file) and `<out>.md` (the same for people). Everything is
written into a temporary folder beside `out` and renamed into place only once the file has been loaded back and
measured: a failure, or a converter's crash, leaves nothing half-written.
"""

from __future__ import annotations

import datetime
import glob
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer import __version__
from trainer.core.catalog import (
    CALIBRATION_IMAGES,
    EXPORT_CONVERTERS,
    EXPORT_DESCRIPTIONS,
    EXPORT_FORMATS,
    EXPORT_REGISTRY,
    INT8_METHODS,
)
from trainer.core.errors import InputError, first_line
from trainer.core.files import atomic_write_text
from trainer.core.rundir import RunDir
from trainer.core.system import pid_alive
from trainer.data.frame import Frame
from trainer.deploy import formats
from trainer.deploy.evaluation import top_classes
from trainer.deploy.inference import FlipAveraged, LoadedModel, Preprocess, classify, load_model, load_run_model
from trainer.deploy.model_card import markdown, out_problem
from trainer.device.machine import OtherLoad, threads_for
from trainer.model.checkpoint import describe_write_failure, is_write_failure

log = logging.getLogger(__name__)

# what carries its computation (eval.tta too): every format but the weight files


class ExportError(InputError, ValueError):
    pass


@dataclass
class ExportOptions:
    """How onnx_int8 is made: --int8, and the images static quantization is calibrated on."""
    int8: str = "auto"
    calibration: Path | None = None  # a folder of images; None: a sample of the run's training split
    calibration_images: int = CALIBRATION_IMAGES


def check_format(fmt: str, out: Path, options: ExportOptions) -> None:
    """Refuse, before anything is loaded or written, a format that is unknown or whose converter is missing."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"--format: unknown format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    if fmt in EXPORT_CONVERTERS:
        module, install = EXPORT_CONVERTERS[fmt]
        if importlib.util.find_spec(module) is None:
            raise ExportError(f"--format {fmt}: needs {module}, which is not installed here ({install})")
    if options.int8 not in INT8_METHODS:
        raise ExportError(f"--int8: {options.int8!r} is not one of {', '.join(INT8_METHODS)}")
    if options.calibration_images < 1:
        raise ExportError(f"--calibration-images: must be at least 1, got {options.calibration_images}")
    check_out(fmt, out)


def check_out(fmt: str, out: Path) -> None:
    """ExportError when `--out` would replace what is not an export of the same format (`out_problem`)."""
    problem = out_problem(fmt, out)
    if problem:
        raise ExportError(problem)


def export_run(run: RunDir, fmt: str, out: Path, which: str = "best", options: ExportOptions | None = None) -> Path:
    """Export a run's checkpoint as `fmt` to `out`, load it back, measure it, and write its model card beside it."""
    options = options or ExportOptions()
    load = OtherLoad()  # the other programs' load while this converts: the timings' threads are fitted to it
    check_format(fmt, out, options)
    loaded = load_run_model(run, which)
    state, pre = loaded.state, loaded.state["preprocess"]
    if EXPORT_REGISTRY[fmt].calibration_folder and options.calibration is not None:  # refused before anything is made
        from trainer.deploy.export_data import calibration_images

        calibration_images(run, state["config"], options.calibration, options.calibration_images, 0)
    check_writable(out.parent)
    remove_stale_work(out)
    in_graph = EXPORT_REGISTRY[fmt].graph
    net = loaded.net.to(memory_format=torch.contiguous_format)
    check_room(net, out.parent)
    if pre.get("tta") and in_graph:
        net = FlipAveraged(net).eval()
    # the network as exported, preprocessed as the export will be: the reference of every measurement
    reference = LoadedModel(net, list(state["classes"]), Preprocess(Frame.from_record(pre), tuple(pre["mean"]),
                            tuple(pre["std"]), tta=bool(pre.get("tta")) and not in_graph), loaded.source, state,
                            thresholds=loaded.thresholds)
    work = Path(tempfile.mkdtemp(prefix=f"{work_prefix(out)}{os.getpid()}-", dir=out.parent))
    try:
        target = work / out.name
        conversion = formats.part(fmt, "write")(net, target, formats.WriteContext(reference, run, options, work))
        sidecar = {"format": fmt, "model_name": state["model_name"], "classes": state["classes"],
                   **Frame.from_record(pre).to_record(), "mean": pre["mean"], "std": pre["std"],
                   "source_run": str(run.path), "checkpoint": str(loaded.source), "epoch": state["epoch"],
                   "best_acc": state.get("best_acc")}
        if loaded.multilabel:  # every label's probability is its logit's sigmoid; a label is on at its threshold
            sidecar.update(task="multilabel", outputs="logits; sigmoid per label", thresholds=loaded.thresholds)
        if pre.get("tta"):  # eval.tta: in the graph, or the caller averages the mirror image's logits
            sidecar["tta"] = "graph" if in_graph else "caller"
        atomic_write_text(Path(f"{target}.json"), json.dumps(sidecar))
        with threads_for(load) as others:  # the export loaded, checked and timed on them
            card = _card(run, fmt, target, out.name, sidecar, reference, conversion, others)
        atomic_write_text(Path(f"{target}.json"), json.dumps(card, indent=1))
        atomic_write_text(Path(f"{target}.md"), markdown(card))
        _move_into_place(target, out, work)
    except Exception as e:
        if not is_write_failure(e):
            raise
        raise ExportError(f"--out: {out}: cannot be written ({describe_write_failure(e, out.parent)})") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("exported %s as %s to %s", loaded.source, fmt, out)
    return out


def _move_into_place(target: Path, out: Path, work: Path) -> None:
    """The file (or Core ML's folder), then its cards, renamed over whatever was there."""
    if out.is_dir():  # an earlier .mlpackage: renamed aside (into `work`, removed with it), then replaced
        os.replace(out, work / "replaced")
    os.replace(target, out)
    for suffix in (".json", ".md"):
        os.replace(f"{target}{suffix}", f"{out}{suffix}")


def work_prefix(out: Path) -> str:
    """The name an export's temporary folder starts with (then its process id): `.OUT.tmp-PID-XXXX`."""
    return f".{out.name}.tmp-"


def remove_stale_work(out: Path) -> None:
    """The temporary folders of earlier exports to `out` whose process is gone (killed mid-export: 1 MB each)."""
    for folder in out.parent.glob(f"{glob.escape(work_prefix(out))}*"):
        pid = folder.name[len(work_prefix(out)):].partition("-")[0]
        if folder.is_dir() and not folder.is_symlink() and (not pid.isdigit() or not pid_alive(int(pid))):
            shutil.rmtree(folder, ignore_errors=True)


EXPORT_SLACK_BYTES = 1 << 20  # room an export needs beyond its weights (graph, card)


def check_room(net: torch.nn.Module, folder: Path) -> None:
    """ExportError when `folder`'s disk has less room than the network's weights in fp32: the converters write
    the whole file, and one (torch.export.save) aborts the process with a C++ stack when the disk fills."""
    needed = sum(t.numel() * t.element_size() for t in net.state_dict().values()) + EXPORT_SLACK_BYTES
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ExportError(f"--out: no space left on device in {folder}: the export needs about {needed / 1e6:.1f} MB, "
                          f"{free / 1e6:.1f} MB are free")


def check_writable(folder: Path) -> None:
    """The folder exists (made if need be) and this process can create files in it; ExportError naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".traindeck-write-check-")
        probe.close()
    except OSError as e:
        raise ExportError(f"--out: {folder}: cannot write there ({e.strerror or first_line(e)})") from e


def _card(run: RunDir, fmt: str, target: Path, name: str, sidecar: dict, reference: LoadedModel,
          conversion: dict | None, others: float = 0.0) -> dict:
    """The model card's content: the sidecar, the file, what was measured (or why not), the training, the snippets."""
    from trainer.deploy import export_measure as measure
    from trainer.deploy.export_data import measure_set
    from trainer.deploy.model_card import CARD_VERSION, load_snippets

    state, classes = reference.state, reference.classes
    frame = Frame.from_record(sidecar)
    card = {**sidecar, "card_version": CARD_VERSION, "traindeck": __version__,
            "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "description": EXPORT_DESCRIPTIONS[fmt], "file": {"name": name, "bytes": _bytes(target)}}
    if conversion:
        card["conversion"] = conversion
    not_measured = {}
    if formats.runs_here(fmt):
        try:
            exported = load_model(target)
        except InputError as e:
            raise ExportError(f"{name}: the {fmt} file written does not load back ({e})") from e
        card["checked"] = f"loaded back with {formats.runtime(fmt)} and measured"
        images, why = measure_set(run, classes, int(state["config"].get("train", {}).get("seed", 0)))
        if images is None:
            not_measured["accuracy"] = why
        else:
            try:
                card["metrics"] = measure.accuracy(exported, reference, images, images.recorded_for(state["epoch"]))
            except ValueError as e:
                not_measured["accuracy"] = str(e)
        sample = measure.sample_images(images, frame, reference.preprocess.decode)
        one = EXPORT_REGISTRY[fmt].one_image
        timed = measure.speeds({"export": exported, "checkpoint": reference}, sample, one_at_a_time=one)
        for speed in timed.values():
            speed["harness"]["other_programs_cores"] = round(others, 2)
        card["speed"] = {**timed["export"], "runtime": formats.runtime(fmt), "machine": measure.machine(),
                         "checkpoint": timed["checkpoint"]}
    else:  # a file this machine cannot run: its format's own check of what was written
        try:
            card["checked"], why = formats.part(fmt, "check")(target, frame.shape, len(classes))
        except Exception as e:  # noqa: BLE001 - whatever the converter says about a file it cannot read
            raise ExportError(f"{name}: the {fmt} file written does not load back ({first_line(e)})") from e
        not_measured["accuracy and speed"] = why
    not_measured.update(formats.part(fmt, "not_measured", dict)())
    if not_measured:
        card["not_measured"] = not_measured
    card["training"] = training_facts(run, state)
    card["load"] = load_snippets(fmt, name, state["model_name"], len(classes), frame.shape)
    return card


def _bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def training_facts(run: RunDir, state: dict) -> dict:
    """The run behind a checkpoint: its config, data counts, weights and precision (from its `run_start` event)."""
    last = run.last_events("run_start", "test")
    start, test = last.get("run_start", {}), last.get("test", {})
    weights = start.get("weights") or None
    data = {"train_images": start.get("train_size"), "val_images": start.get("val_size")}
    if test.get("images"):
        data["test_images"] = test["images"]
    trained = run.read_status().get("epoch")  # the run's epochs, not the checkpoint's (best.pt may be earlier)
    return {"run": run.path.name, "epochs_trained": max(trained or 0, state["epoch"]), "checkpoint_epoch": state["epoch"],
            "config": state["config"], "data": data,
            "weights": weights.get("name") or weights.get("file") if weights else None,
            "precision": start.get("precision")}


@dataclass
class Prediction:
    """One image's result: the top classes with their probabilities (best first), or why it could not be read.
    Multi-label: `labels`, every label at or above its threshold (most probable first), and `probabilities`, every
    label's."""
    path: str
    top: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None
    labels: list[tuple[str, float]] | None = None
    probabilities: dict[str, float] | None = None

    @property
    def label(self) -> str:
        return self.top[0][0]

    @property
    def probability(self) -> float:
        return self.top[0][1]


def expand_images(paths: list[Path]) -> list[Path]:
    """The images to classify: files as given; folders replaced by the image files under them (sorted)."""
    from trainer.data.scan import image_paths

    out = []
    for p in paths:
        out += [Path(f) for f in image_paths(p)] if p.is_dir() else [p]
    return out


def predict(source: Path, images: list[Path], top: int = 1, which: str = "best") -> list[Prediction]:
    """Classify images (files, or folders of them) with a run's checkpoint or an exported model, preprocessed as in
    training. An image that cannot be read gets an `error` naming it; the others are still classified."""
    model = load_model(source, which)
    results = [Prediction(str(p)) for p in expand_images(images)]
    found = classify(model, [r.path for r in results])
    for i, reason in found.errors.items():
        results[i].error = f"{results[i].path}: {reason}"
    probs = model.probabilities(found.logits)
    indices = top_classes(found.logits, min(top, len(model.classes)))  # as evaluate ranks them, ties included
    values = probs.gather(1, indices)
    for i, v, c in zip(found.kept, values.tolist(), indices.tolist()):
        results[i].top = [(model.classes[j], p) for j, p in zip(c, v)]
    if model.multilabel:
        for i, row in zip(found.kept, probs.tolist()):
            results[i].probabilities = dict(zip(model.classes, row))
            on = [(name, p) for name, p, t in zip(model.classes, row, model.thresholds) if p >= t]
            results[i].labels = sorted(on, key=lambda x: -x[1])
    return results

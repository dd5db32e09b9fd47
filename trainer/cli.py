"""Headless command line: `python main.py <command> ...` (the app's own subprocesses use it too)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from trainer.core import clock
from trainer.core.catalog import (
    DEPRECATED_EXPORT_FORMATS,
    RUN_CHECKPOINTS,
)
from trainer.core.config import RunConfig, config_from, load_config, read_config_file, save_config
from trainer.core.errors import InputError
from trainer.core.rundir import RunDir, default_runs_dir, report_end, user_log_dir
from trainer.core.system import hold_preempt_signal, ignore_preempt_signal
from trainer.core.user_code import FLAG as MODEL_CODE_FLAG
from trainer.core.user_code import grant
from trainer.data.scan import printable_path
from trainer.runs.commands import (
    Audit,
    AugmentPreview,
    Auto,
    DescribeModel,
    Export,
    FetchWeights,
    GradCam,
    Label,
    LrFind,
    Predict,
    ProbeDevices,
    Queue,
    Resident,
    Resume,
    Standby,
    Summarize,
    Sweep,
    Train,
)

log = logging.getLogger("traindeck")

UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # an output the user named that cannot be written: exit 2
COMMANDS = ("train", "resume", "check-data", "demo-data", "slurm", "describe-model", "probe-devices", "auto",
            "export", "predict", "lr-find", "augment-preview", "fetch-weights", "evaluate", "audit", "label",
            "grad-cam", "queue", "sweep", "standby", "resident", "hosts", "agent", "mirror", "fetch", "summarize")


class CommandError(InputError):
    """A command refused its input: the message is printed alone (no traceback) and the command exits 2."""


def _fail(message: str, code: int = 2) -> int:
    # a name from a file (an image's, a label's) never drives the terminal: control characters shown escaped
    shown = "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in message)
    print(f"error: {shown}", file=sys.stderr)
    return code


def cmd_train(args) -> int:
    from trainer.runs.prepare import prepare_run
    from trainer.runs.runner import launch

    cfg = load_config(args.config, args.set + ([f"device.host={args.host}"] if args.host else []))
    choices = read_choices(args.auto_choices) if args.auto_choices else None
    if cfg.device.host:
        from trainer.remote.remote_cli import remote_train

        return remote_train(cfg, args, choices)
    if args.detach:
        raise CommandError("--detach: only for a run on a host (device.host); a run here goes on when the app "
                           "closes anyway")
    if getattr(args, "resumable", False) and args.run_dir and RunDir(args.run_dir).holds_a_run():
        return go_on_restarted(RunDir(args.run_dir))
    run, lock = prepare_run(cfg, runs_dir=args.runs_dir or default_runs_dir(), run_dir=args.run_dir,
                            overwrite=args.overwrite, output_log=args.output_log, choices=choices)
    print(f"run directory: {run.path}", flush=True)
    return report_end(run, launch(run, cfg, lock=lock))


def _parser_train(sub) -> None:
    p = Train.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_train)


def go_on_restarted(run: RunDir) -> int:
    """`train --resumable` where the run already is (a requeued job): resumed from its last checkpoint as `resume`
    does, or, when it completed, nothing more to do (exit 0: the job is not run again)."""
    if run.effective_state() == "completed":
        print(f"run directory: {run.path} already holds this run, completed: nothing more to do", flush=True)
        return 0
    print(f"run directory: {run.path} ({run.effective_state()}: going on from its last checkpoint)", flush=True)
    return cmd_resume(argparse.Namespace(run_dir=str(run.path), epochs=None, force=False))


def _model_code_option(p) -> None:
    p.add_argument(MODEL_CODE_FLAG, action="append", default=[], metavar="FILE.py:CLASS",
                   help="trust your own nn.Module class in FILE.py (its present bytes) to build the network: a "
                   "checkpoint, sidecar or config that names a .py file runs nothing without this (or the app's "
                   "Own model file…); remembered for that file until it changes")


def read_choices(path: str) -> list[dict]:
    """--auto-choices: Auto's choices (the JSON of `main.py auto --plan-only`, or its `choices` list)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CommandError(f"--auto-choices: {path}: cannot be read as JSON ({e})") from e
    choices = data.get("choices") if isinstance(data, dict) else data
    if not isinstance(choices, list):
        raise CommandError(f"--auto-choices: {path}: no list of choices in it")
    return choices


def cmd_auto(args) -> int:
    started = clock.command_started()  # the budget is the whole command's, its imports included
    say = lambda text: print(f"auto: {text}", file=sys.stderr, flush=True)  # noqa: E731
    if args.host:  # planned there, on its devices (inside a job on a SLURM host); trained there as any remote run
        from trainer.remote.remote_cli import plans_in_job, remote_auto, remote_plan

        if args.download_weights:
            raise CommandError(f"--download-weights: the weights go into the cache of the machine that trains: on "
                               f"{args.host}, run `main.py fetch-weights resnet18` there")

        if not args.plan_only:
            return remote_auto(args, say, started)
        plan = plans_in_job(args.host) or remote_plan(args.host, args.folder, args.minutes, args.set, say,
                                                      labels=args.labels)
    else:
        from trainer.auto import plan as make_plan

        if args.download_weights and _download_offered(args, say):
            started = clock.now()  # the download is not the budget's: it is made once for every later plan
        plan = make_plan(args.folder, args.minutes, started=started, overrides=args.set, progress=say,
                         labels=args.labels).to_json()
    from trainer.auto import trained_as_one_run

    if args.plan_only:  # whoever trains it (the app, `auto --host` here) trains it as one run
        if not plan.get("in_job"):
            plan = trained_as_one_run(plan, "whoever asked for this plan (the app, --plan-only)")
        print(json.dumps(plan), flush=True)
        return 0
    if args.run_dir:  # someone follows that one directory (a SLURM job's mirror): no second run elsewhere
        plan = trained_as_one_run(plan, "Auto with --run-dir (what follows the run watches that directory)")
    run, code = _train_plan(plan, args, args.run_dir)
    if run.read_status().get("reason") in ("too_slow", "too_fast"):  # train.min_epochs, train.recheck_epochs
        run, code = _measure_again(run, args, started, say)
    for path in sorted((run.path / "exports").glob("model.*")):
        if path.suffix == ".json":
            continue
        print(f"exported: {path}", flush=True)
    print(f"time: {(clock.now() - started) / 60:.1f} min of the {args.minutes:g} min budget (test set and export "
          f"included)", flush=True)
    return code


def download_progress(name: str, say, every: int = 1):
    """A download's progress callback: "NAME: DONE/TOTAL MB" through `say` at each `every` percent (the line the Auto
    box's bar reads)."""
    shown = {"step": -1}

    def progress(done: int, total: int) -> None:
        step = (done * 100 // total if total else 0) // every
        if step != shown["step"]:
            shown["step"] = step
            say(f"{name}: {done / 1e6:.1f}/{total / 1e6:.1f} MB")

    return progress


def _download_offered(args, say) -> bool:
    """`auto --download-weights`: the ImageNet weights Auto offers for this folder (photographs, none cached),
    downloaded into the cache with progress, so that the plan fine-tunes them; offline, said, and the plan goes on
    from scratch. Whether a download was made."""
    from trainer.auto import offer_for
    from trainer.model.weights import WeightsUnavailable, fetch, resolve

    offer = offer_for(args.folder, args.labels)
    if offer is None:
        say("--download-weights: nothing to download (pretrained weights are cached already, or the images do not "
            "look like photographs)")
        return False
    named = resolve(offer["model"], offer["weights"])
    say(f"downloading {offer['model']}'s ImageNet weights ({offer['megabytes'] or 0:.1f} MB) from {named.source}")
    try:
        fetch(named, download_progress(named.file.name, say, every=10))
    except WeightsUnavailable as e:
        say(f"{e}; planning from scratch")
        return True
    return True


def _train_plan(plan: dict, args, run_dir: str | None) -> tuple[RunDir, int]:
    """Auto's plan trained here as a run (its choices printed, and kept as the run's auto.json)."""
    from trainer.runs.prepare import choices_lines, prepare_run
    from trainer.runs.runner import launch

    print("\n".join(choices_lines(plan["choices"])), flush=True)
    cfg = RunConfig.from_dict(plan["config"])
    run, lock = prepare_run(cfg, runs_dir=args.runs_dir or default_runs_dir(), run_dir=run_dir,
                            label=f"auto-{cfg.model.name}", output_log=args.output_log, checked=False,
                            choices=plan["choices"])
    print(f"run directory: {run.path}", flush=True)
    return run, report_end(run, launch(run, cfg, lock=lock))


def _measure_again(first: RunDir, args, started: float, say) -> tuple[RunDir, int]:
    """The first epoch of Auto's run showed too few epochs fit (train.min_epochs) or, after a probe on a busy machine,
    many more than planned (train.recheck_epochs): the faster (or the larger) candidates measured again, as the
    machine is now, for the time left (after a busy probe: all of them, best first), and the best of them trained in a
    new run. When none is left, the same one is chosen again, or there is no time to measure, the first run goes on
    as it is."""
    from trainer.auto import MIN_MINUTES, AutoError
    from trainer.auto import plan as make_plan
    from trainer.runs.runner import launch

    cfg = load_config(first.config)
    measuring = clock.now()
    slow = first.read_status()["reason"] == "too_slow"
    why = (f"{cfg.model.name} at {cfg.data.image_size} px was {'too slow' if slow else 'faster than measured'} in "
           f"{first.name}: {first.read_status()['message']}")
    say(f"{why}; measuring {'the faster' if slow else 'all the'} candidates again")
    minutes_left = args.minutes - (clock.now() - started) / 60
    tried = (cfg.model.name, cfg.data.image_size, why)
    try:
        if minutes_left < MIN_MINUTES:
            raise AutoError(f"{minutes_left:.2f} min left, too little to measure again")
        plan = make_plan(args.folder, minutes_left, started=clock.now(), overrides=args.set, progress=say,
                         labels=args.labels, **{"faster_than" if slow else "recheck_of": tried}).to_json()
        if (plan["config"]["model"]["name"], plan["config"]["data"]["image_size"]) == tried[:2]:
            raise AutoError(f"measured again, {tried[0]} at {tried[1]} px is still the best that fits")
    except AutoError as e:
        say(f"{e}: {first.name} goes on as it is")
        cfg.train.min_epochs = cfg.train.recheck_epochs = 0
        # the epochs its first epoch showed fit (it ended before re-planning them): it re-plans from there
        cfg.train.epochs = max(cfg.train.epochs, int(first.read_status().get("fit_epochs") or 0))
        # the time measuring again took is the budget's too (the trainer's clock counts only its own segments)
        cfg.train.budget = max(0.01, round(cfg.train.budget - (clock.now() - measuring) / 60, 3))
        save_config(cfg, first.config)
        return first, report_end(first, launch(first, cfg, resume=True))
    return _train_plan(plan, args, None)


def _parser_auto(sub) -> None:
    p = Auto.add_parser(sub)
    p.set_defaults(func=cmd_auto)


def cmd_resume(args) -> int:
    from trainer.runs.runner import launch
    from trainer.train.preflight import preflight

    run = RunDir(args.run_dir)
    if run.is_remote:
        from trainer.remote.remote_cli import remote_resume

        return remote_resume(run, args.epochs, args.force)
    if not run.config.exists():
        raise CommandError(f"{run.path}: not a run directory (no config.yaml)")
    if run.is_live():
        raise CommandError(f"{run.path}: the run is still going (pid {run.read_status().get('pid')}); stop it first")
    lock = run.lock()
    try:
        status = run.read_status()
        if damage := run.damage():
            raise CommandError(f"{damage}: the run is damaged and is not resumed (its checkpoints are untouched; "
                               f"train them on in a new run with --set model.weights=CHECKPOINT)")
        if status.get("state") == "completed" and not args.force and args.epochs is None:
            raise CommandError(f"{run.path}: the run already completed; continue it for more epochs with --epochs "
                               f"TOTAL, or pass --force to train it again from its last checkpoint")
        cfg = load_config(run.config)
        preflight(cfg)
        if args.epochs is not None:
            from trainer.runs.prepare import extend_run

            note = extend_run(run, cfg, status, args.epochs)
            if note:
                print(note, flush=True)
    except BaseException:
        lock.close()
        raise
    return report_end(run, launch(run, cfg, resume=True, lock=lock))


def _parser_resume(sub) -> None:
    p = Resume.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_resume)


def cmd_check_data(args) -> int:
    from dataclasses import asdict

    from trainer.data.duplicates import ImageRef, find_duplicates, format_duplicates, leak_worth
    from trainer.data.findings import read_findings
    from trainer.data.manifest import read_manifest
    from trainer.data.scan import data_root, find_layout, format_report, scan_image_folder

    if args.host:
        if args.json or args.exclude:
            raise CommandError("--host: --json and --exclude name files here; scan a host's folder without them")
        from trainer.remote.remote_cli import forward

        return forward(args.host, ["check-data", args.dir])
    if args.labels:  # multi-label: the labels file against the folder's images (not class folders)
        from trainer.data.labels import check_against_folder, format_labels_report, read_labels
        from trainer.data.scan import check_images, image_paths

        labels = read_labels(args.labels)
        unlisted = check_against_folder(labels, image_paths(args.dir))
        checked = check_images([image for image, _ in labels.items], full=True)
        bad = [(image, reason) for (image, _), (reason, _) in zip(labels.items, checked) if reason]
        print("\n".join(format_labels_report(labels, unlisted, bad)))
        return 0
    if args.exclude and not os.path.lexists(args.exclude):
        raise CommandError(f"--exclude: {args.exclude}: no such manifest file")
    manifest = read_manifest(args.exclude) if args.exclude else None
    layout = find_layout(args.dir)  # a folder with its own train/ val/ test/: each split, and the leaks between them
    # the training folder with the manifest's additions too, as training scans it (it counted 120 where training used 121)
    splits = {name: scan_image_folder(layout[f"{name}_dir"], manifest=manifest if name == "train" else None,
                                      additions=name == "train")
              for name in ("train", "val", "test") if layout[f"{name}_dir"]}
    for result in splits.values():
        print(format_report(result))
    found = find_duplicates(ImageRef(name, path, r.classes[label]) for name, r in splits.items()
                            for path, label in r.samples)
    print("\n".join(format_duplicates(found, data_root(*(layout[f"{name}_dir"] for name in splits)))))
    if args.run:  # what the leaks were worth to that run's test score
        predictions = RunDir(args.run).evaluation("test") / "predictions.csv"
        if not predictions.is_file():
            raise CommandError(f"--run: {predictions}: no test evaluation in that run (main.py evaluate RUN first)")
        print(leak_worth(predictions, found).line())
        findings = read_findings(args.run)  # what the run's last audit found
        print(findings.line() if findings else f"label issues, copies and outliers: not looked for yet (main.py audit "
                                               f"{args.run})")
    result = splits["train"]
    if args.json:
        Path(args.json).write_text(json.dumps({
            "root": result.root, "classes": result.classes, "counts": result.counts,
            "bad_files": result.bad_files, "warnings": result.warnings, "problems": result.problems(),
            "excluded": result.excluded, "relabelled": result.relabelled,
            "splits": {name: r.root for name, r in splits.items()},
            "duplicates": [{"leak": g.leak, "images": [asdict(i) for i in g.images]} for g in found.groups]}))
    return 1 if result.problems() else 0


def _parser_check_data(sub) -> None:
    p = sub.add_parser("check-data", help="scan an ImageFolder tree without training")
    p.add_argument("dir")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--exclude", help="a data.exclude manifest to honour (images left out or relabelled)")
    p.add_argument("--host", help="scan the folder on this host (main.py hosts)")
    p.add_argument("--run", help="a run evaluated on this folder's test/: its test accuracy with and without the "
                   "leaked images")
    p.add_argument("--labels", help="multi-label: a labels file (CSV: file,labels or one-hot) to check against the "
                   "folder's images (docs/multilabel.md)")
    p.set_defaults(func=cmd_check_data)


def cmd_demo_data(args) -> int:
    from trainer.data.demo_data import write_demo_dataset

    root = write_demo_dataset(args.dir, per_class=args.per_class, size=args.size, seed=args.seed)
    print(f"wrote the demo dataset to {root}")
    return 0


def _parser_demo_data(sub) -> None:
    p = sub.add_parser("demo-data", help="write the built-in demo dataset (drawn shapes)")
    p.add_argument("dir")
    p.add_argument("--per-class", type=int, default=250)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo_data)


def cmd_slurm(args) -> int:
    """Write the resolved config and the batch script that trains it (printed when no --out is given)."""

    from trainer.runs.launch import write_slurm_array, write_slurm_files
    from trainer.runs.sweep import is_sweep, sweep_from

    runs = Path(default_runs_dir()).resolve()
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        raise CommandError(f"--cpus-per-task: must be at least 1, got {args.cpus_per_task}")
    raw = read_config_file(args.config)  # a sweep file or a run config: parsed once
    if is_sweep(raw):
        sweep = sweep_from(raw, args.config)
        if sweep.method == "optuna":
            raise CommandError(f"{args.config}: a SLURM job array runs grid and random sweeps; an optuna study "
                               f"needs its trials one after another (run it with main.py sweep)")
        if args.set:
            raise CommandError("--set: change a sweep's base config or its grid instead")
        script = Path(args.out or f"{sweep.name}.sh")
        trials = write_slurm_array(sweep, script, runs, args.cpus_per_task)
        print(f"wrote {script.resolve()} (a job array of {len(sweep.trials_values())} trials) and their configs in "
              f"{trials}; submit it with: sbatch {script}")
        return 0
    cfg = config_from(raw, args.config, args.set)
    if args.out:
        config_path = write_slurm_files(cfg, args.out, runs, args.cpus_per_task)
        print(f"wrote {Path(args.out).resolve()} and the config it trains, {config_path}; submit it with: "
              f"sbatch {args.out}")
        return 0
    script = runs / "configs" / f"slurm-{time.strftime('%Y%m%d-%H%M%S')}.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    config_path = write_slurm_files(cfg, script, runs, args.cpus_per_task)
    print(f"# wrote {script} and the config it trains, {config_path}", file=sys.stderr)
    print(script.read_text(encoding="utf-8"))
    return 0


def _parser_slurm(sub) -> None:
    p = sub.add_parser("slurm", help="print a SLURM batch script for a multi-node run of CONFIG")
    p.add_argument("config")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", help="write the script here instead of printing it")
    p.add_argument("--cpus-per-task", type=int, metavar="N", help="CPUs per node's task (default: what the config "
                   "asks for, the processes and their data-loader workers)")
    p.set_defaults(func=cmd_slurm)


def cmd_describe_model(args) -> int:
    """JSON on stdout: the model's parameter tensors, its head and the normalisation its weights mean (for the
    app's Model page and parameter-groups editor); with --store, the model store table."""
    from trainer.core.config import ModelConfig
    from trainer.core.groups import is_head_parameter
    from trainer.model.models import create_model, head_name, torchvision_classifiers
    from trainer.model.weights import normalisation, weights_names

    if args.list:
        print(json.dumps({"models": torchvision_classifiers()}))
        return 0
    if args.store:
        from trainer.model.weights import model_store

        print(json.dumps(model_store()))
        return 0
    cfg = ModelConfig(name=args.name, weights=args.weights or None)
    model = create_model(ModelConfig(name=args.name), args.classes)
    head = head_name(model)
    params = [{"name": n, "shape": list(p.shape), "numel": p.numel(), "head": is_head_parameter(head, n)}
              for n, p in model.named_parameters()]
    mean, std, source = normalisation(cfg)
    print(json.dumps({"name": args.name, "parameters": params, "total": sum(p["numel"] for p in params),
                      "head": head, "weights": weights_names(args.name),
                      "normalisation": {"mean": mean, "std": std, "source": source}}))
    return 0


def _parser_describe_model(sub) -> None:
    p = DescribeModel.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_describe_model)


def cmd_evaluate(args) -> int:
    """Evaluate a run's checkpoint on a folder: RUN_DIR/eval/NAME/metrics.json and predictions.csv."""
    from trainer.deploy.evaluation import evaluate_run

    folder, metrics = evaluate_run(Path(args.run_dir), args.data, args.checkpoint, args.name, args.overwrite,
                                   args.labels)
    if metrics.get("task") == "multilabel":
        print(f"{metrics['images']} images: mAP {100 * (metrics['map'] or 0):.1f}% (micro "
              f"{100 * (metrics['map_micro'] or 0):.1f}%), every label right on {100 * metrics['exact_match']:.1f}%, "
              f"at the thresholds the run chose" + (f"; {len(metrics['skipped'])} unusable files skipped"
                                                    if metrics["skipped"] else ""))
        print(f"wrote {folder / 'metrics.json'} and {folder / 'predictions.csv'}")
        return 0
    top5 = f", top-5 {100 * metrics['top5_accuracy']:.1f}%" if "top5_accuracy" in metrics else ""
    print(f"{metrics['images']} images: accuracy {100 * metrics['accuracy']:.1f}%{top5}, loss {metrics['loss']:.4f}, "
          f"ECE {metrics['ece']:.3f}" + (f"; {len(metrics['skipped'])} unusable files skipped" if metrics["skipped"]
                                         else ""))
    print(f"wrote {folder / 'metrics.json'} and {folder / 'predictions.csv'}")
    return 0


def _parser_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="evaluate a run's checkpoint on a folder (metrics and per-image predictions)")
    p.add_argument("run_dir")
    p.add_argument("--data", help="the ImageFolder to evaluate (default: the run's data.test_dir)")
    p.add_argument("--labels", help="multi-label runs: the labels file of the images to evaluate (default: the "
                                    "run's data.test_labels)")
    p.add_argument("--checkpoint", default="best", choices=RUN_CHECKPOINTS)
    p.add_argument("--name", help="the evaluation's name under RUN_DIR/eval/ (default: the folder's; val is reserved)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation of the same folder")
    _model_code_option(p)
    p.set_defaults(func=cmd_evaluate)


def cmd_audit(args) -> int:
    """The label issues, copies and outliers of a run's images (trainer.deploy.audit): printed, and kept under
    RUN/audit/."""
    from dataclasses import asdict

    from trainer.deploy.audit import audit_run, format_audit

    run = RunDir(args.run_dir)
    if not run.config.exists():
        raise CommandError(f"{run.path}: not a run directory (no config.yaml)")
    if load_config(run.config).multilabel:
        from trainer.deploy.audit_multilabel import audit_multilabel_run

        if args.oof == "runs":
            raise CommandError("--oof runs: for runs of one label per image; a multi-label run's audit takes the probe")
        audit = audit_multilabel_run(run, args.folds, with_map=args.map)
    else:
        cross_fit = None
        if args.oof == "runs":  # k training runs, each without one fold
            from trainer.runs.cross_fit import cross_fitted as cross_fit
        audit = audit_run(run, args.folds, with_map=args.map, cross_fit=cross_fit)
    if args.json:
        print(json.dumps({"images": audit.images, "folds": audit.folds, "reused": audit.reused,
                          "skipped": audit.skipped, "suspects": [asdict(s) for s in audit.suspects],
                          "outliers": [asdict(o) for o in audit.outliers],
                          "duplicates": [{"near": g.near, "leak": g.leak, "similarity": g.similarity,
                                          "images": [asdict(i) for i in g.images]} for g in audit.duplicates.groups],
                          "leak_worth": audit.leak_worth.line() if audit.leak_worth else None,
                          "map": str(run.path / "audit" / "map.csv") if args.map else None, "map_how": audit.map_how}))
    else:
        print("\n".join(format_audit(audit, run, args.top)))
        if args.map:
            print(f"map: {run.path / 'audit' / 'map.csv'} ({audit.map_how})")
    return 0


def cmd_label(args) -> int:
    """The pool images to label next (trainer.deploy.label_next), the network's most uncertain first."""
    from dataclasses import asdict

    from trainer.deploy.label_next import format_next, next_to_label

    run = RunDir(args.run_dir)
    if not run.config.exists():
        raise CommandError(f"{run.path}: not a run directory (no config.yaml)")
    if not Path(args.pool).is_dir():
        raise CommandError(f"--pool {args.pool}: no such folder")
    found = next_to_label(run, args.pool, args.next, args.manifest)
    if args.json:
        print(json.dumps(asdict(found)))
    else:
        print("\n".join(format_next(found, args.manifest)))
    return 0


def _parser_label(sub) -> None:
    p = Label.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_label)


def _parser_audit(sub) -> None:
    p = Audit.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_audit)


def cmd_queue(args) -> int:
    """The run queue of a runs directory: add, list, run (the scheduler), hold, release, move, remove, retry."""
    from trainer.runs import queue

    runs_dir = Path(args.runs_dir or default_runs_dir())
    if args.action == "add":
        if not args.target:
            raise CommandError("queue add: give the config file to queue")
        cfg = load_config(args.target, args.set)
        print(queue.add(runs_dir, cfg).path)  # an invalid config is refused and nothing is queued
        return 0
    if args.action == "list":
        waiting = queue.queued(runs_dir)
        for i, run in enumerate(waiting, start=1):
            q = run.read_status().get("queue", {})
            flags = " (held)" if q.get("held") else (" (starting)" if q.get("scheduler") else "")
            print(f"{i}\t{run.path}{flags}")
        if not waiting:
            print("the queue is empty", file=sys.stderr)
        for run, why in queue.damaged_runs(runs_dir):
            print(f"damaged (passed over): {run.path}: {why}", file=sys.stderr)
        schedulers = queue.live_schedulers(runs_dir)
        print(f"scheduler(s) running: {', '.join(map(str, schedulers))}" if schedulers else
              "no scheduler is running (start one with: main.py queue run)", file=sys.stderr)
        return 0
    if args.action == "run":
        return queue.main_loop(runs_dir, args.until_empty, args.cpu_runs)
    if not args.target:
        raise CommandError(f"queue {args.action}: give the run directory")
    run = RunDir(args.target)
    if not run.config.exists():
        raise CommandError(f"{run.path}: not a run directory (no config.yaml)")
    try:
        if args.action in ("hold", "release"):
            queue.hold(run.path.parent, run, args.action == "hold")
        elif args.action == "move":
            queue.move(run.path.parent, run, args.to)
        elif args.action == "remove":
            queue.remove(run.path.parent, run)
        elif args.action == "retry":
            queue.retry(run.path.parent, run)
    except ValueError as e:
        raise CommandError(str(e)) from e
    return 0


def _parser_queue(sub) -> None:
    p = Queue.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_queue)


def cmd_sweep(args) -> int:
    """Queue every trial of a sweep file (grid / random), or run an Optuna study (method: optuna)."""
    from trainer.runs.sweep import queue_sweep, read_sweep

    sweep = read_sweep(args.sweep)
    runs_dir = Path(args.runs_dir or default_runs_dir())
    if sweep.method == "optuna":
        from trainer.runs.optuna_sweep import run_study

        return run_study(sweep, runs_dir)
    runs = queue_sweep(sweep, runs_dir)
    for run in runs:
        print(run.path)
    print(f"queued {len(runs)} runs of sweep {sweep.name}; a scheduler runs them (main.py queue run --runs-dir "
          f"{runs_dir})", file=sys.stderr)
    return 0


def _parser_sweep(sub) -> None:
    p = Sweep.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_sweep)


def cmd_grad_cam(args) -> int:
    """Grad-CAM of a run's checkpoint on one image: the overlay PNG, and a JSON summary on stdout."""
    from trainer.deploy.gradcam import NoSpatialLayer, grad_cam_for_run

    if RunDir(args.run_dir).is_remote:
        from trainer.remote.remote_cli import fetch_checkpoint

        fetch_checkpoint(RunDir(args.run_dir), args.checkpoint)
    try:
        result = grad_cam_for_run(Path(args.run_dir), Path(args.image), Path(args.out), args.checkpoint, args.cls)
    except NoSpatialLayer as e:
        raise CommandError(f"{args.run_dir}: {e}") from e
    print(json.dumps(result))
    return 0


def _parser_grad_cam(sub) -> None:
    p = GradCam.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_grad_cam)


def cmd_fetch_weights(args) -> int:
    """Download a model's published weights into the cache (to prepare a machine that will be offline)."""
    from trainer.core.config import ModelConfig
    from trainer.model.weights import fetch, is_timm, resolve

    if is_timm(args.model):
        from trainer.model.weights import create_timm

        create_timm(ModelConfig(name=args.model, weights="DEFAULT"), 1000)
        print(f"{args.model}: pretrained weights are in the Hugging Face cache")
        return 0
    named = resolve(args.model, args.weights)
    if named.cached:
        print(f"{named.file} (already cached)")
        return 0
    print(f"downloading {named.source} into {named.file.parent}", file=sys.stderr, flush=True)
    progress = download_progress(named.file.name, lambda text: print(text, file=sys.stderr, flush=True))

    def cancelled(signum, frame):  # Cancel (the app's) or Ctrl+C: the partial file goes, the cache stays as it was
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, cancelled)
    try:
        print(fetch(named, progress))
    except KeyboardInterrupt:
        print(f"cancelled: nothing of {named.file.name} kept in {named.file.parent}", file=sys.stderr, flush=True)
        return 130
    return 0


def _parser_fetch_weights(sub) -> None:
    p = FetchWeights.add_parser(sub)
    p.set_defaults(func=cmd_fetch_weights)


def cmd_probe_devices(args) -> int:
    """JSON on stdout: this machine's facts and the trainer's verdicts on them (what auto precision picks and
    why, which options are refused and why); the app shows these and keeps no rule of its own."""
    if args.host:
        from trainer.remote.remote_cli import forward

        return forward(args.host, ProbeDevices().argv())
    from trainer.device.devices import auto_precision, refusals
    from trainer.device.machine import machine_facts
    from trainer.runs.queue import busy_gpus, gpu_usage

    facts = machine_facts()
    gpu_name = facts["gpus"][0]["name"] if facts["gpus"] else None
    usage = gpu_usage()
    print(json.dumps({
        **facts,
        "usage": usage,  # NVML: memory (every process's, other users' included) and utilisation of each GPU
        "busy": sorted(busy_gpus(usage, set())),  # kept busy by someone else: the queue does not place runs there
        "auto_precision": {"cpu": auto_precision("auto", "cpu", facts),
                           "cuda": auto_precision("auto", "cuda", facts, gpu_name),
                           "mps": auto_precision("auto", "mps", facts)},
        "refused": refusals(facts),
    }))
    return 0


def _parser_probe_devices(sub) -> None:
    p = ProbeDevices.add_parser(sub)
    p.set_defaults(func=cmd_probe_devices)

    from trainer.remote.remote_cli import add_parsers

    add_parsers(sub)


def cmd_export(args) -> int:
    from trainer.deploy.model_card import read_card, summary

    if args.format in DEPRECATED_EXPORT_FORMATS:
        print(f"note: {DEPRECATED_EXPORT_FORMATS[args.format]}", file=sys.stderr)
    run = RunDir(args.run_dir)
    if run.is_remote:
        from trainer.remote.remote_cli import remote_export

        out = remote_export(run, Export.from_args(args), Path(args.out).resolve())
    else:
        from trainer.deploy.export import ExportOptions, export_run

        out = export_run(run, args.format, Path(args.out), args.checkpoint, ExportOptions(
            args.int8, Path(args.calibration) if args.calibration else None, args.calibration_images))
    print(f"exported {out} (+ {out.name}.json and {out.name}.md, its model card)")
    card = read_card(out)
    if card:
        print(summary(card))
    return 0


def _parser_export(sub) -> None:
    p = Export.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_export)


def cmd_predict(args) -> int:
    """Classify images or folders; an unreadable file is named (exit 2) and the others are still printed."""
    from trainer.deploy.export import predict

    if args.top < 1:
        raise CommandError(f"--top: must be at least 1, got {args.top}")
    if RunDir(args.model).is_remote:
        from trainer.remote.remote_cli import fetch_checkpoint

        fetch_checkpoint(RunDir(args.model), args.checkpoint)
    results = predict(Path(args.model), [Path(p) for p in args.images], top=args.top, which=args.checkpoint)
    if args.json:
        print(json.dumps([{"path": r.path, "top": r.top, "error": r.error}
                          | ({"labels": r.labels, "probabilities": r.probabilities} if r.labels is not None else {})
                          for r in results]))
    for r in results:
        if r.error:
            print(f"error: {printable_path(r.error)}", file=sys.stderr)
        elif not args.json:  # multi-label: the labels at or above their thresholds (maybe none)
            shown = r.labels if r.labels is not None else r.top
            print("\t".join([printable_path(r.path)] + [f"{c}\t{p:.3f}" for c, p in shown]))
    return 2 if any(r.error for r in results) else 0


def _parser_predict(sub) -> None:
    p = Predict.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_predict)


def cmd_lr_find(args) -> int:
    import tempfile

    from trainer.core.events import LR_POINT
    from trainer.train.lr_find import LrFindError, find_lr
    from trainer.train.preflight import preflight

    if not 0 < args.start < args.end:
        raise CommandError(f"--start {args.start:g} --end {args.end:g}: the range must start above 0 and end above "
                           f"its start")
    if args.steps < 10:
        raise CommandError(f"--steps {args.steps}: at least 10 steps make a curve")
    cfg = load_config(args.config, args.set)
    preflight(cfg)

    def point(lr: float, loss: float) -> None:  # the curve as it grows, for whoever follows stderr (the app)
        print(f"{LR_POINT} {lr:.6g} {loss:.6g}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = find_lr(cfg, RunDir(tmp).create(), steps=args.steps, start=args.start, end=args.end,
                             on_point=point if args.json else None)
        except LrFindError as e:
            raise CommandError(str(e)) from e
    lr = result["suggested_lr"]
    if args.json:
        print(json.dumps(result))
    elif lr is None:
        low, high = result["extend"]
        print(f"lr-find: {result['why']}: try --start {low:.3g} --end {high:.3g}")
    else:
        print(f"suggested optimizer.lr: {lr:.3g} ({result['why']})")
    if args.write and lr is None:
        raise CommandError(f"--write: nothing written to {args.config}: {result['why']}")
    if args.write:
        from trainer.train.lr_find import write_suggestion

        print(f"wrote optimizer.lr: {write_suggestion(args.config, lr):.3g} to {args.config}", file=sys.stderr)
    return 0


def cmd_augment_preview(args) -> int:
    from trainer.data.preview import augment_preview

    for flag, value in (("--images", args.images), ("--draws", args.draws)):
        if value < 1:
            raise CommandError(f"{flag}: must be at least 1, got {value}")
    cfg = load_config(args.config, args.set)
    result = augment_preview(cfg, Path(args.out), args.images, args.draws, args.seed)
    if args.json:
        print(json.dumps(result))
        return 0
    for choice in result["decided"]:
        print(f"{choice['key']}: auto -> {choice['value']} ({choice['why']})")
    for row in result["images"]:
        print(f"{row['label']}: {row['path']} -> {row['original']} and {len(row['draws'])} draws")
    return 0


def _parser_augment_preview(sub) -> None:
    p = AugmentPreview.add_parser(sub)
    p.set_defaults(func=cmd_augment_preview)


def _parser_lr_find(sub) -> None:
    p = LrFind.add_parser(sub)
    _model_code_option(p)
    p.set_defaults(func=cmd_lr_find)


def cmd_standby(args) -> int:
    from trainer.runs.standby import serve

    return serve(main)  # handed the entry point: standby does not import the CLI back


def _parser_standby(sub) -> None:
    p = Standby.add_parser(sub)
    p.set_defaults(func=cmd_standby)


def cmd_summarize(args) -> int:
    """Build, or bring up to date, a run's events summary (events.summary.jsonl): the events file read once as a
    stream, in bounded memory. What the app runs in the background before it opens a long run that has none (runs
    from before summaries, copied without one); a live run's trainer keeps its own."""
    from trainer.core.summary import PARTIAL_EVERY_S, SummaryKeeper, read_header, summary_path

    run = RunDir(args.run_dir)
    if not run.events.is_file():
        raise CommandError(f"{run.path}: no events.jsonl here (not a run directory?)")
    if run.is_live():
        print(json.dumps({"summary": None, "why": "the run is live: its trainer keeps its summary"}))
        return 0
    started = time.perf_counter()
    header = read_header(summary_path(run.events), run.events)
    keeper = SummaryKeeper.resume(run.events, write_every_s=PARTIAL_EVERY_S)  # shown while the rest is read
    keeper.write()
    print(json.dumps({"summary": str(keeper.path), "events": keeper.count, "bytes": keeper.offset,
                      "taken_up": header["offset"] if header else 0, "seconds": round(time.perf_counter() - started, 2)}))
    return 0


def _parser_summarize(sub) -> None:
    p = Summarize.add_parser(sub)
    p.set_defaults(func=cmd_summarize)


def cmd_resident(args) -> int:
    from trainer.runs.resident import serve

    return serve(main)  # handed the entry point: the resident worker does not import the CLI back


def _parser_resident(sub) -> None:
    p = Resident.add_parser(sub)
    p.set_defaults(func=cmd_resident)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python main.py", description="TrainDeck: train image classifiers.")
    sub = parser.add_subparsers(dest="command", required=True)

    for add in (  # each command's parser is declared beside the command
        _parser_train,
        _parser_auto,
        _parser_standby,
        _parser_resident,
        _parser_resume,
        _parser_check_data,
        _parser_demo_data,
        _parser_slurm,
        _parser_describe_model,
        _parser_evaluate,
        _parser_audit,
        _parser_label,
        _parser_queue,
        _parser_sweep,
        _parser_grad_cam,
        _parser_fetch_weights,
        _parser_probe_devices,
        _parser_export,
        _parser_lr_find,
        _parser_augment_preview,
        _parser_predict,
        _parser_summarize,
    ):
        add(sub)
    return parser


QUIET_LIBRARIES = ("faiss", "faiss.loader", "openTSNE")  # their INFO lines (which CPU build loaded, which method) are
# not the user's business: warnings still show


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    hold_preempt_signal()  # SLURM's warning ends no TrainDeck process; a trainer here or a rank handles it
    try:
        for spec in getattr(args, "model_code", []):
            grant(spec)
        return args.func(args)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as e:  # noqa: BLE001 - the user sees a message; a traceback only goes to the log file
        if isinstance(e, InputError):
            return _fail(str(e))
        log_file = record_traceback(args.command)
        if isinstance(e, OSError):
            from trainer.model.checkpoint import describe_write_failure

            where = e.filename or Path.cwd()
            if e.errno in UNWRITABLE:  # a place the user named cannot be written: their input, exit 2, one line
                return _fail(f"{where}: cannot write there ({e.strerror})")
            return _fail(f"{describe_write_failure(e, where)} (details in {log_file})", 1)
        return _fail(f"{type(e).__name__}: {e} (a TrainDeck bug? details in {log_file})", 1)
    finally:
        ignore_preempt_signal()  # the command is over: a warning now ends nothing (nor the interpreter's exit)


def record_traceback(command: str) -> Path | str:
    """Append the current exception's traceback to the user's TrainDeck log; its path (or why it failed)."""
    import traceback

    path = user_log_dir() / "cli.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"--- main.py {command}\n{traceback.format_exc()}\n")
    except OSError as e:
        return f"nowhere: {e.strerror}"
    return path

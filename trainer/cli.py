"""Headless command line: `python main.py <command> ...` (the app's own subprocesses use it too)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from trainer.config import ConfigError, load_config, save_config
from trainer.rundir import RunDir, default_runs_dir, new_run_dir

log = logging.getLogger("traindeck")

COMMANDS = ("train", "resume", "check-data", "demo-data", "slurm", "describe-model", "probe-devices",
            "export", "predict", "lr-find")


def _fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def cmd_train(args) -> int:
    from trainer.runner import launch
    from trainer.strategy import LaunchError, check_device

    try:
        cfg = load_config(args.config, args.set)
        check_device(cfg)
    except (ConfigError, LaunchError) as e:
        return _fail(str(e))
    if args.run_dir:
        run = RunDir(args.run_dir).create()
    else:
        label = Path(cfg.model.name.split(":")[-1]).stem
        run = new_run_dir(args.runs_dir or default_runs_dir(), label)
    from trainer.runner import RunDirInUse, lock_run_dir

    try:
        lock_run_dir(run).close()  # fail before overwriting the config of a run in progress
    except RunDirInUse as e:
        return _fail(str(e))
    save_config(cfg, run.config)
    print(f"run directory: {run.path}", flush=True)
    try:
        return _finish(run, launch(run, cfg))
    except RunDirInUse as e:
        return _fail(str(e))


def cmd_resume(args) -> int:
    from trainer.rundir import pid_alive
    from trainer.runner import launch

    run = RunDir(args.run_dir)
    if not run.config.exists():
        return _fail(f"{run.path}: not a run directory (no config.yaml)")
    status = run.read_status()
    if status.get("state") in ("running", "starting") and pid_alive(status.get("pid")):
        return _fail(f"{run.path}: the run is still going (pid {status.get('pid')}); stop it first")
    if status.get("state") == "completed" and not args.force:
        return _fail(f"{run.path}: the run already completed; pass --force to train it again from its last "
                     f"checkpoint (raise train.epochs in config.yaml to train longer)")
    from trainer.runner import RunDirInUse

    try:
        cfg = load_config(run.config)
        return _finish(run, launch(run, cfg, resume=True))
    except ConfigError as e:
        return _fail(str(e))
    except RunDirInUse as e:
        return _fail(str(e))


def _finish(run: RunDir, code: int) -> int:
    status = run.read_status()
    state = status.get("state", "unknown")
    best = status.get("best_acc")
    tail = f", best val_acc {100 * best:.1f}%" if isinstance(best, (int, float)) else ""
    line = f"run {state}{tail}: {run.path}"
    if status.get("message") and state != "completed":
        line += f"\nreason: {status['message']}"
    print(line, file=sys.stderr if code else sys.stdout, flush=True)
    return code


def cmd_check_data(args) -> int:
    from trainer.scan import DataError, format_report, scan_image_folder

    try:
        result = scan_image_folder(args.dir)
    except DataError as e:
        return _fail(str(e))
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "root": result.root, "classes": result.classes, "counts": result.counts,
            "bad_files": result.bad_files, "warnings": result.warnings, "problems": result.problems()}))
    return 1 if result.problems() else 0


def cmd_demo_data(args) -> int:
    from trainer.demo_data import write_demo_dataset

    root = write_demo_dataset(args.dir, per_class=args.per_class, size=args.size, seed=args.seed)
    print(f"wrote the demo dataset to {root}")
    return 0


def cmd_slurm(args) -> int:
    from trainer.launch import slurm_script

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as e:
        return _fail(str(e))
    script = slurm_script(args.config, cfg)
    if args.out:
        Path(args.out).write_text(script)
        print(f"wrote {args.out}; submit it with: sbatch {args.out}")
    else:
        print(script)
    return 0


def cmd_describe_model(args) -> int:
    """JSON on stdout: the model's parameter tensors (for the app's parameter-groups editor)."""
    from trainer.config import ModelConfig
    from trainer.models import ModelError, create_model, torchvision_classifiers

    if args.list:
        print(json.dumps({"models": torchvision_classifiers()}))
        return 0
    try:
        model = create_model(ModelConfig(name=args.name), args.classes)
    except ModelError as e:
        return _fail(str(e))
    params = [{"name": n, "shape": list(p.shape), "numel": p.numel()} for n, p in model.named_parameters()]
    print(json.dumps({"name": args.name, "parameters": params, "total": sum(p["numel"] for p in params)}))
    return 0


def cmd_probe_devices(args) -> int:
    """JSON on stdout: GPUs, distributed backends and launchers available here (run as a short subprocess)."""
    import importlib.util

    import torch
    import torch.distributed as dist

    from trainer.strategy import native_bf16

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": props.name, "memory_gb": round(props.total_memory / 2**30, 1)})
    print(json.dumps({
        "gpus": gpus,
        "bf16_cuda": bool(gpus) and native_bf16(torch.device("cuda", 0)),
        "bf16_cpu": native_bf16(torch.device("cpu")),
        "backends": {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available() and bool(gpus),
                     "mpi": dist.is_mpi_available()},
        "horovod": importlib.util.find_spec("horovod") is not None,
        "torch": torch.__version__,
    }))
    return 0


def cmd_export(args) -> int:
    from trainer.export import ExportError, export_run

    try:
        out = export_run(RunDir(args.run_dir), args.format, Path(args.out), args.checkpoint)
    except ExportError as e:
        return _fail(str(e), 1)
    print(f"exported {out} (+ {out.name}.json)")
    return 0


def cmd_predict(args) -> int:
    from trainer.export import ExportError, predict

    try:
        results = predict(Path(args.export), [Path(p) for p in args.images])
    except ExportError as e:
        return _fail(str(e), 1)
    for path, label, prob in results:
        print(f"{path}\t{label}\t{prob:.3f}")
    return 0


def cmd_lr_find(args) -> int:
    import tempfile

    import yaml

    from trainer.lr_find import find_lr
    from trainer.models import ModelError
    from trainer.scan import DataError

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as e:
        return _fail(str(e))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = find_lr(cfg, RunDir(tmp).create(), steps=args.steps, start=args.start, end=args.end)
        except (DataError, ModelError, ConfigError, ValueError) as e:
            return _fail(str(e))
    lr = result["suggested_lr"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"suggested optimizer.lr: {lr:.3g} (steepest descent at {result['steepest_lr']:.3g}, "
              f"lowest loss at {result['min_loss_lr']:.3g})")
    if args.write:
        raw = yaml.safe_load(Path(args.config).read_text()) or {}
        raw.setdefault("optimizer", {})["lr"] = float(f"{lr:.3g}")
        Path(args.config).write_text(yaml.safe_dump(raw, sort_keys=False))
        print(f"wrote optimizer.lr: {lr:.3g} to {args.config}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python main.py", description="TrainDeck: train image classifiers.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train headless from a YAML config")
    p.add_argument("config")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="override config keys")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run-dir", help="use this run directory")
    where.add_argument("--runs-dir", help="create the run directory under this folder (default ./runs)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("resume", help="continue a stopped, failed or killed run from its last good checkpoint")
    p.add_argument("run_dir")
    p.add_argument("--force", action="store_true", help="also resume a completed run")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("check-data", help="scan an ImageFolder tree without training")
    p.add_argument("dir")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.set_defaults(func=cmd_check_data)

    p = sub.add_parser("demo-data", help="write the built-in demo dataset (drawn shapes)")
    p.add_argument("dir")
    p.add_argument("--per-class", type=int, default=250)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo_data)

    p = sub.add_parser("slurm", help="print a SLURM batch script for a multi-node run of CONFIG")
    p.add_argument("config")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", help="write the script here instead of printing it")
    p.set_defaults(func=cmd_slurm)

    p = sub.add_parser("describe-model", help="JSON list of a model's parameter tensors")
    p.add_argument("name", nargs="?", default="small_cnn")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--list", action="store_true", help="list torchvision classifiers instead")
    p.set_defaults(func=cmd_describe_model)

    p = sub.add_parser("probe-devices", help="JSON of GPUs and distributed backends available here")
    p.set_defaults(func=cmd_probe_devices)

    p = sub.add_parser("export", help="export a run's checkpoint for other tools")
    p.add_argument("run_dir")
    p.add_argument("--format", default="state_dict",
                   choices=("state_dict", "safetensors", "exported_program", "torchscript", "onnx"))
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default="best", choices=("best", "last"))
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("lr-find", help="sweep the learning rate and suggest one")
    p.add_argument("config")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--start", type=float, default=1e-6)
    p.add_argument("--end", type=float, default=10.0)
    p.add_argument("--json", action="store_true", help="print the whole curve as JSON")
    p.add_argument("--write", action="store_true", help="write the suggestion into the config file")
    p.set_defaults(func=cmd_lr_find)

    p = sub.add_parser("predict", help="classify images with an exported model")
    p.add_argument("export")
    p.add_argument("images", nargs="+")
    p.set_defaults(func=cmd_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    return args.func(args)

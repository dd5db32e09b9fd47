"""Checks made before a run directory exists: what a launch would refuse, refused at once with exit 2.

Cheap by design: folders are listed (not decoded), the model is built on the meta device, the weights file is
matched against it by names and shapes. The trainer checks all of this again, and more, when it starts.
"""

from __future__ import annotations

from trainer.core.config import DataConfig, RunConfig
from trainer.data.scan import DataError, check_same_classes, quick_layout
from trainer.device.machine import check_device
from trainer.model.models import check_model

MLFLOW_ANSWER_S = 5.0  # a tracking server given by its address must answer /health within this


def preflight(cfg: RunConfig) -> None:
    """Raise the input error (ConfigError, DataError, ModelError, LaunchError) a launch of `cfg` would meet, parameter
    groups included."""
    check_device(cfg)
    check_extras(cfg)
    classes = check_data_folders(cfg.data)
    model = check_model(cfg.model, len(classes))
    if model is not None:
        check_groups(cfg, model)


def check_groups(cfg: RunConfig, model) -> None:
    """Every parameter group receives parameters, among those the trainer will group (freezing applied)."""
    from trainer.core.config import ConfigError
    from trainer.core.groups import group_problems
    from trainer.model.models import head_name

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    problems = group_problems(names, [g.pattern for g in cfg.optimizer.groups], head_name(model),
                              cfg.model.freeze_backbone)
    if problems:
        raise ConfigError(problems)


def check_extras(cfg: RunConfig) -> None:
    """Optional packages a config asks for, with the command that installs them."""
    import importlib.util

    from trainer.core.config import ConfigError

    if cfg.monitor.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(["monitor.tensorboard: needs the tensorboard package; install it with "
                           "pip install -e '.[tensorboard]' (or set monitor.tensorboard: false)"])
    if cfg.monitor.mlflow:
        check_mlflow(cfg.monitor.mlflow)
    if cfg.data.augment.albumentations:  # each transform built (not run): a bad name or argument refused here
        from trainer.data.user_pipeline import build_pipeline

        build_pipeline(cfg.data.augment.albumentations)


def check_mlflow(uri: str) -> None:
    """monitor.mlflow: the package installed, and a tracking server given by its address answering (a typo would
    otherwise cost the whole run's log, said only in train.log)."""
    import importlib.util
    import urllib.error
    import urllib.request

    from trainer.core.config import ConfigError

    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(["monitor.mlflow: needs the mlflow package; install it with pip install -e '.[mlflow]' (or "
                           "leave monitor.mlflow empty)"])
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=MLFLOW_ANSWER_S):
            pass
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise ConfigError([f"monitor.mlflow: no MLflow tracking server answers at {uri} ({reason}); start it "
                           f"(mlflow server --host 127.0.0.1 --port 5000) or correct the address"]) from None


def check_data_folders(data: DataConfig) -> list[str]:
    """The training classes, once the train (and val) folders are usable ImageFolders with the same classes."""
    if not data.train_dir:
        raise DataError("data.train_dir: not set (the ImageFolder to train on)")
    if data.labels:
        return check_labels_files(data)
    classes = _layout(data.train_dir, "data.train_dir")
    if data.val_dir:
        check_same_classes(classes, _layout(data.val_dir, "data.val_dir"), data.val_dir)
    if data.test_dir:
        check_same_classes(classes, _layout(data.test_dir, "data.test_dir"), data.test_dir, "data.test_dir")
    if data.exclude:
        from trainer.data.loader import load_manifest

        load_manifest(data).filter([], classes)  # readable, and relabels only to existing classes
    return classes


def check_labels_files(data: DataConfig) -> list[str]:
    """Multi-label: the labels, once every labels file reads and lists only images that are there (the manifest's
    exclusions applied); the trainer reads them again."""
    from trainer.data.labels import labelled_scan
    from trainer.data.loader import load_manifest

    manifest = load_manifest(data)
    names = labelled_scan(data.labels, "data.labels", data.train_dir, manifest=manifest, additions=True).classes
    for key in ("val_labels", "test_labels"):
        if getattr(data, key):
            labelled_scan(getattr(data, key), f"data.{key}", names=names, manifest=manifest)
    return names


def _layout(folder: str, key: str) -> list[str]:
    try:
        return quick_layout(folder)
    except DataError as e:
        raise DataError(f"{key}: {e}") from e

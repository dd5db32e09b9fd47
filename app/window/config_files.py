"""The form as files: open and save a config, the headless command that trains it, its SLURM script, the recent
configs and the last session's form. Command lines come from `trainer/runs/launch.py`."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import yaml
from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.window.form import Form
from trainer.core.config import ConfigError, RunConfig, load_config, save_config
from trainer.core.rundir import new_config_file
from trainer.runs.launch import headless_command, node_commands, write_slurm_files

log = logging.getLogger(__name__)
RECENT = 10  # configs remembered


class ConfigFiles(QObject):
    said = Signal(str, int)  # a line for the status bar, and for how many ms

    def __init__(self, form: Form, settings: QSettings, parent: QWidget):
        super().__init__(parent)
        self.form, self.settings = form, settings
        self.parent_widget = parent  # the dialogs' parent

    def open_dialog(self) -> None:
        start = self.settings.value("last_config_dir", self._near_the_dataset())
        path, _ = QFileDialog.getOpenFileName(self.parent_widget, "Open config", start, "YAML (*.yaml *.yml)")
        if path:
            self.settings.setValue("last_config_dir", str(Path(path).parent))
            self.open(Path(path))

    def open(self, path: Path) -> bool:
        loaded = self.form.load_file(path)
        if loaded and self.form.config_path:
            self._remember_recent(str(self.form.config_path))
        return loaded

    def _refused(self) -> bool:
        if self.form.config() is not None:
            return False
        QMessageBox.warning(self.parent_widget, "Cannot save", "Fix the marked settings first:\n" + "\n".join(self.form.problems))
        return True

    def save_dialog(self) -> None:
        if self._refused():
            return
        folder = Path(self.settings.value("last_config_dir", self._near_the_dataset()))
        start = str(self.form.config_path or folder / "config.yaml")
        path, _ = QFileDialog.getSaveFileName(self.parent_widget, "Save config", start, "YAML (*.yaml *.yml)")
        if path:
            self.save(Path(path))

    def save(self, path: Path) -> None:
        save_config(self.form.config(), path)
        self.form.config_path = path
        self.settings.setValue("last_config_dir", str(path.parent))
        self._remember_recent(str(path))

    def command_text(self) -> str:
        """The headless command(s) for the current form: one line, or one per node for multi-node runs."""
        cfg = self.form.config()
        if cfg is None:
            return ""
        path = self.form.config_path
        if path is None or load_config(path).to_dict() != cfg.to_dict():
            path = new_config_file(self.form.runs_folder.path)
            save_config(cfg, path)
        if cfg.device.nnodes > 1:
            return "\n".join(f"# node {i}\n{c}" for i, c in enumerate(node_commands(path, cfg)))
        return shlex.join(headless_command(path, self.form.runs_folder.path))

    def copy_command(self) -> None:
        text = self.command_text()
        if text:
            QGuiApplication.clipboard().setText(text)
            self.said.emit("Copied: " + text.splitlines()[-1], 5000)

    def save_slurm_dialog(self) -> None:
        if self._refused():
            return
        start = str(Path(self.settings.value("last_config_dir", self._near_the_dataset())) / "train.sh")
        path, _ = QFileDialog.getSaveFileName(self.parent_widget, "Save SLURM script", start, "Shell scripts (*.sh)")
        if path:
            self.save_slurm_script(Path(path))

    def save_slurm_script(self, path: Path) -> Path:
        """The SLURM batch script for the current form and, beside it, the config it trains (as `main.py slurm`)."""
        config_path = write_slurm_files(self.form.config(), path, self.form.runs_folder.path)
        self.said.emit(f"Saved {path} and {config_path.name}; submit with: sbatch {path}", 8000)
        return config_path

    def _remember_recent(self, path: str) -> None:
        recent = [p for p in (self.settings.value("recent_configs") or []) if p != path]
        self.settings.setValue("recent_configs", [path] + recent[:RECENT - 1])

    def _near_the_dataset(self) -> str:
        """Where a file dialog opens when nothing was chosen before: beside the dataset, else the home folder."""
        dataset = str(self.form.model.get("data.train_dir") or "")
        return str(Path(dataset).parent) if dataset and Path(dataset).parent.is_dir() else str(Path.home())

    # ---- the last session's form -------------------------------------------------------------------
    def restore_last(self) -> bool:
        """The form as the last session left it (dataset, model, every setting); False when there is none or it no
        longer reads as a config (then the demo config is loaded)."""
        text = self.settings.value("last_config")
        if not isinstance(text, str) or not text.strip():
            return False
        try:
            cfg = RunConfig.from_dict(yaml.safe_load(text) or {})
        except (ConfigError, yaml.YAMLError, TypeError, ValueError) as e:
            log.warning("the last session's settings are not usable (%s): opening the demo config", e)
            return False
        path = self.settings.value("last_config_path")
        self.form.config_path = Path(path) if isinstance(path, str) and path else None
        self.form.load(cfg, set_by="your last session")
        return True

    def keep_for_next_session(self) -> None:
        cfg = self.form.config()  # an invalid form is not kept: the next start opens the demo config
        self.settings.setValue("last_config", cfg.to_yaml() if cfg is not None else "")
        self.settings.setValue("last_config_path", str(self.form.config_path or ""))

"""Device page: CPU or GPUs found here, the parallel mode, processes, backend, precision, multi-node settings.

What this machine offers, and the trainer's verdicts on it (which options it refuses and why, what
`train.amp: auto` picks), come from `main.py probe-devices` (a short subprocess; CUDA is never initialised
in the GUI process). This page shows those answers; the rules themselves live in `trainer.device.devices`.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.jobs.background import CliJob
from app.state.form_model import USER
from app.widgets.forms import Binder, scrolling
from trainer.core.catalog import PARALLEL_MODES
from trainer.core.config import ConfigError, RunConfig, key_choices
from trainer.device.devices import device_problems
from trainer.runs.commands import Hosts, ProbeDevices


def gpu_line(gpu: dict, usage: dict | None, busy: bool) -> str:
    """One GPU as the Device page lists it: name and size, and with NVML its use now (all processes', other users'
    included) and whether someone else's job keeps it busy (the trainer's verdict)."""
    line = f"GPU {gpu['index']}: {gpu['name']} ({gpu['memory_gb']} GB)"
    if usage:
        util = f"{usage['utilization']}% busy, " if usage.get("utilization") is not None else ""
        line += f" — {util}{usage['memory_used_mb'] / 1024:.1f}/{usage['memory_total_mb'] / 1024:.1f} GB in use"
    if busy:
        line += " — busy with another job: the queue does not place runs on it"
    return line


class DevicePage(QWidget):
    slurmRequested = Signal()
    hostChanged = Signal(str)  # device.host: "" for this machine

    def __init__(self, binder: Binder, parent: QWidget | None = None):
        super().__init__(parent)
        self.binder = binder
        self.model = binder.model  # the form's values (the page shows the devices')
        self.probe: dict | None = None
        self.probe_error = ""
        self._job: CliJob | None = None

        self._build_controls(binder)

        where = QGroupBox("Where")
        wf = QFormLayout(where)
        run_on = QWidget()
        column = QVBoxLayout(run_on)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.run_on)
        column.addWidget(self.hosts_note)
        wf.addRow("Run on", run_on)
        self.found_label = QLabel("Found here")
        wf.addRow(self.found_label, self.devices)
        wf.addRow("Device", self.type)
        wf.addRow("GPUs", self.gpus)

        par = QGroupBox("Parallel mode")
        pf = QFormLayout(par)
        pf.addRow("Mode", self.mode)
        pf.addRow("Processes per node", binder.spin("device.nproc"))
        pf.addRow("Backend", binder.combo("device.backend", key_choices("device.backend")))
        pf.addRow("Rendezvous", binder.combo("device.init_method", key_choices("device.init_method")))
        pf.addRow("Rank timeout", binder.spin("device.timeout_s", " s"))
        pf.addRow(binder.check("train.sync_batchnorm", "SyncBatchNorm across processes"))
        pf.addRow(self.reasons)

        nodes, prec = self._build_lower_boxes(binder)

        content = QWidget()
        layout = QVBoxLayout(content)
        scrolling(self, content)
        for box in (where, par, nodes, prec):
            layout.addWidget(box)
        layout.addStretch(1)
        self.type.currentTextChanged.connect(lambda _: self._apply_availability())
        self.model.listen(self._model_changed)

    def _build_lower_boxes(self, binder: Binder) -> tuple[QGroupBox, QGroupBox]:
        """Several machines (and the SLURM script), precision and speed."""
        nodes = QGroupBox("Several machines (torchrun)")
        nf = QFormLayout(nodes)
        nf.addRow("Nodes", binder.spin("device.nnodes"))
        nf.addRow("This node's rank", binder.spin("device.node_rank"))
        nf.addRow("Node 0 address", binder.line("device.master_addr"))
        nf.addRow("Port", binder.spin("device.master_port"))
        self.slurm = QPushButton("Save SLURM script…")
        self.slurm.setObjectName("saveSlurm")
        self.slurm.setToolTip("A batch script for a SLURM cluster that trains exactly this config (saved beside it)")
        self.slurm.clicked.connect(self.slurmRequested)
        nf.addRow("", self.slurm)

        prec = QGroupBox("Precision and speed")
        rf = QFormLayout(prec)
        rf.addRow("Mixed precision", binder.combo("train.amp", key_choices("train.amp")))
        self.amp_note = QLabel("")
        self.amp_note.setObjectName("autoPrecision")
        self.amp_note.setStyleSheet("color: #666;")
        rf.addRow("", self.amp_note)
        rf.addRow("Memory format", binder.combo("train.memory_format", key_choices("train.memory_format")))
        rf.addRow(binder.check("train.compile", "torch.compile the model (slow first steps)"))
        return nodes, prec

    def _build_controls(self, binder: Binder) -> None:
        """Where to run (this machine or a host), the devices found there, the device type and GPUs, the parallel
        mode and why some modes cannot run here."""
        self.run_on = QComboBox()  # device.host: this machine, or a host of hosts.yaml (`main.py hosts list`)
        self.run_on.setObjectName("runOn")
        self.run_on.addItem("This machine", "")
        self.run_on.setToolTip("Train here, on a host over SSH, or through a SLURM login node (main.py hosts add; "
                               "docs/remote.md)")
        self.run_on.currentIndexChanged.connect(self._host_changed)
        self.hosts_note = QLabel("")
        self.hosts_note.setObjectName("hostsNote")
        self.hosts_note.setWordWrap(True)
        self.hosts_note.setStyleSheet("color: #666;")
        self.hosts_note.hide()  # shown only when it has something to say
        self._wanted_host = ""
        self._hosts_job: CliJob | None = None
        self.devices = QListWidget()
        self.devices.setObjectName("deviceList")
        self.devices.setMaximumHeight(64)
        self.devices.addItem("probing this machine…")
        self.type = binder.combo("device.type", key_choices("device.type"))
        self.gpus = binder.line("device.gpus", "e.g. 0, 1")
        self.gpus.setProperty("kind", "int_list")
        self.mode = QComboBox()
        self.mode.setObjectName("parallelMode")
        self.mode.addItems([m[0] for m in PARALLEL_MODES])
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.reasons = QLabel("")
        self.reasons.setObjectName("unavailableReasons")
        self.reasons.setWordWrap(True)
        self.reasons.setStyleSheet("color: #666;")

    # ---- where ---------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return self.run_on.currentData() or ""

    def load_hosts(self) -> None:
        job = CliJob(Hosts(action="list", json=True), self)
        job.done.connect(self._hosts_listed)
        job.failed.connect(lambda error: self._hosts_note(f"hosts.yaml: {error}"))
        self._hosts_job = job

    def _hosts_listed(self, hosts: list) -> None:
        self._hosts_job = None
        self.run_on.blockSignals(True)
        while self.run_on.count() > 1:
            self.run_on.removeItem(1)
        for h in hosts:
            self.run_on.addItem(h["label"], h["name"])
        self.run_on.blockSignals(False)
        self._hosts_note("" if hosts else "Add a machine to train on with: python main.py hosts add NAME "
                                "--ssh DESTINATION --command 'PYTHON MAIN.PY' --runs DIR (docs/remote.md)")
        self._select_host(self._wanted_host)

    def _hosts_note(self, text: str) -> None:
        self.hosts_note.setText(text)
        self.hosts_note.setVisible(bool(text))

    def _select_host(self, name: str) -> None:
        self._wanted_host = name
        index = self.run_on.findData(name)
        if index < 0 and name:
            self.run_on.addItem(f"{name} (not in hosts.yaml)", name)
            index = self.run_on.count() - 1
        if index >= 0 and index != self.run_on.currentIndex():
            self.run_on.setCurrentIndex(index)

    def _host_changed(self, _index: int) -> None:
        self._wanted_host = self.host
        self.found_label.setText(f"Found on {self.host}" if self.host else "Found here")
        self.cancel_jobs(hosts=False)
        self.probe = None
        self.start_probe()
        self.hostChanged.emit(self.host)
        self.model.set("device.host", self.host, USER)

    # ---- probing -----------------------------------------------------------------------------
    def start_probe(self) -> None:
        self.devices.clear()
        self.devices.addItem(f"probing {self.host}…" if self.host else "probing this machine…")
        job = CliJob(ProbeDevices(host=self.host or None), self)
        job.done.connect(self._probed)
        job.failed.connect(self._probe_failed)
        self._job = job

    def cancel_jobs(self, hosts: bool = True) -> None:
        if self._job is not None:
            self._job.cancel()
            self._job = None
        if hosts and self._hosts_job is not None:
            self._hosts_job.cancel()
            self._hosts_job = None

    def _probed(self, info: dict) -> None:
        self._job = None
        self.probe = info
        self.devices.clear()
        self.devices.addItem("CPU")
        usage = {u["index"]: u for u in info.get("usage", [])}
        for g in info["gpus"]:
            self.devices.addItem(QListWidgetItem(gpu_line(g, usage.get(g["index"]), g["index"] in info.get("busy", []))))
        if info.get("mps"):
            self.devices.addItem("Apple silicon's GPU (MPS)")
        elif not info["gpus"]:
            self.devices.addItem("no CUDA GPU found")
        self._apply_availability()

    def _probe_failed(self, error: str) -> None:
        self._job = None
        self.probe_error = error
        self.devices.clear()
        self.devices.addItem(f"probe failed: {error}")

    def unavailable(self) -> dict[str, str]:
        """Option -> reason, for what this machine cannot run (the trainer's verdict from the probe)."""
        return dict(self.probe.get("refused", {})) if self.probe else {}

    def _apply_availability(self) -> None:
        missing = self.unavailable()
        for combo_key in ("device.type", "device.backend"):
            self._enable(self.binder.widgets[combo_key], missing)
        model: QStandardItemModel = self.mode.model()
        for i, (_, parallel, launcher) in enumerate(PARALLEL_MODES):
            reason = missing.get(parallel) or missing.get(launcher)
            item = model.item(i)
            item.setEnabled(reason is None)
            item.setToolTip(reason or "")
        self.reasons.setText(f"Not available on {self.host or 'this machine'}:<br>" + "<br>".join(
            f"• {r}" for r in sorted(set(missing.values()))) if missing else "")
        self._show_auto_precision()

    def _show_auto_precision(self) -> None:
        """What `train.amp: auto` will pick on the chosen device: the trainer's answer from the probe."""
        picks = self.probe["auto_precision"] if self.probe is not None else {}
        if self.model.get("train.amp") != "auto" or self.model.get("device.type") not in picks:
            self.amp_note.setText("")
            return
        name, reason = picks[self.model.get("device.type")]
        self.amp_note.setText(f"{reason.split(':')[0]}: {name} — {reason.partition(': ')[2]}")

    @staticmethod
    def _enable(combo: QComboBox, missing: dict[str, str]) -> None:
        model: QStandardItemModel = combo.model()
        for idx in range(combo.count()):
            option = combo.itemText(idx)
            model.item(idx).setEnabled(option not in missing)
            model.item(idx).setData(missing.get(option, ""), Qt.ItemDataRole.ToolTipRole)

    # ---- config ------------------------------------------------------------------------------
    def _mode_changed(self, index: int) -> None:
        _, parallel, launcher = PARALLEL_MODES[index]
        self.model.set("device.parallel", parallel, USER)
        self.model.set("device.launcher", launcher, USER)

    def _model_changed(self, key: str | None, _by: str) -> None:
        """The model's device.host and parallel mode shown; what `train.amp: auto` picks follows the precision."""
        if key in (None, "device.host"):
            self._select_host(self.model.get("device.host") or "")
        if key in (None, "device.parallel", "device.launcher"):
            parallel, launcher = self.model.get("device.parallel"), self.model.get("device.launcher")
            for i, (_, mode_parallel, mode_launcher) in enumerate(PARALLEL_MODES):
                if parallel == mode_parallel and (parallel != "ddp" or launcher == mode_launcher):
                    self.mode.blockSignals(True)
                    self.mode.setCurrentIndex(i)
                    self.mode.blockSignals(False)
                    break
        if key in (None, "train.amp", "device.type"):
            self._show_auto_precision()

    def problems(self, raw: dict) -> list[str]:
        """What this machine cannot run in the form's settings (the trainer's rules, on the probe's facts)."""
        if self.probe is None:
            return []
        try:
            cfg = RunConfig.from_dict(raw)
        except ConfigError:
            return []  # the config's own problems are reported by the form
        return device_problems(cfg, self.probe)

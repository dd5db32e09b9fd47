"""Optimizer page: optimizer, parameter-groups editor with live match counts, schedule, loss and loop settings."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.pages.model_page import human
from app.state.form_model import USER
from app.widgets.forms import ERROR_STYLE, Binder, format_number, parse_number, scrolling
from trainer.core.config import key_choices
from trainer.core.groups import assign_groups, group_problems, next_pattern
from trainer.core.recipes import RECIPES, RecipeError, apply_recipe

GROUP_COLUMNS = ["pattern", "lr", "weight decay", "momentum", "freeze", "matches"]


class GroupsEditor(QWidget):
    """A table of parameter groups; the last column shows how many tensors/values each matches."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.parameters: list[tuple[str, int]] = []
        self.head: str | None = None  # the model's classifier head (the page sets it when the model is described)
        self.table = QTableWidget(0, len(GROUP_COLUMNS))
        self.table.setObjectName("groupsTable")
        self.table.setHorizontalHeaderLabels(GROUP_COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.table.setMinimumHeight(130)
        self.table.itemChanged.connect(self._edited)
        add = QPushButton("Add group")
        add.setObjectName("addGroup")
        add.clicked.connect(lambda: self.add_group({"pattern": next_pattern(
            [n for n, _ in self.parameters], [g["pattern"] for g in self.groups()], self.head)}))
        remove = QPushButton("Remove group")
        remove.clicked.connect(self.remove_selected)
        buttons = QHBoxLayout()
        buttons.addWidget(add)
        buttons.addWidget(remove)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.problem = QLabel("")  # why Start is greyed, where the groups are (not only in the status bar)
        self.problem.setObjectName("groupsProblem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #c9302c;")
        self.problem.hide()
        layout.addWidget(self.table)
        layout.addWidget(self.problem)
        layout.addLayout(buttons)
        self._loading = False

    def add_group(self, group: dict) -> None:
        self._loading = True
        row = self.table.rowCount()
        self.table.insertRow(row)
        self.table.setItem(row, 0, QTableWidgetItem(group.get("pattern", "")))
        for col, key in ((1, "lr"), (2, "weight_decay"), (3, "momentum")):
            value = group.get(key)
            self.table.setItem(row, col, QTableWidgetItem("" if value is None else format_number(value)))
        freeze = QCheckBox()
        freeze.setChecked(bool(group.get("freeze")))
        freeze.toggled.connect(self._edited)
        self.table.setCellWidget(row, 4, freeze)
        matches = QTableWidgetItem("")
        matches.setFlags(Qt.ItemFlag.ItemIsEnabled)
        self.table.setItem(row, 5, matches)
        self._loading = False
        self._edited()

    def remove_selected(self) -> None:
        rows = sorted({i.row() for i in self.table.selectedIndexes()}, reverse=True) or (
            [self.table.rowCount() - 1] if self.table.rowCount() else [])
        for row in rows:
            self.table.removeRow(row)
        self._edited()

    def set_groups(self, groups: list[dict]) -> None:
        self.table.setRowCount(0)
        for g in groups:
            self.add_group(g)

    def groups(self) -> list[dict]:
        out = []
        for row in range(self.table.rowCount()):
            g = {"pattern": self.table.item(row, 0).text().strip()}
            for col, key in ((1, "lr"), (2, "weight_decay"), (3, "momentum")):
                value = parse_number(self.table.item(row, col).text())
                if value is not None:
                    g[key] = value
            if self.table.cellWidget(row, 4).isChecked():
                g["freeze"] = True
            out.append(g)
        return out

    def set_parameters(self, parameters: list[tuple[str, int]]) -> None:
        self.parameters = parameters
        self.update_matches()

    def update_matches(self) -> None:
        """Recount matches from the model's parameter names (the same rule the trainer applies)."""
        self._loading = True
        patterns = [g["pattern"] for g in self.groups()]
        assignment = assign_groups([n for n, _ in self.parameters], patterns) if self.parameters else []
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 5)
            if not self.parameters:
                item.setText("…")
                continue
            hits = [numel for (_, numel), idx in zip(self.parameters, assignment) if idx == row]
            item.setText(f"{len(hits)} tensors, {human(sum(hits))}" if hits else "nothing")
            item.setForeground(Qt.GlobalColor.red if not hits else Qt.GlobalColor.black)
        self._loading = False

    def _edited(self, *args) -> None:
        if self._loading:
            return
        self.update_matches()
        self.changed.emit()

    def problems(self, head: str | None = None, freeze_backbone: bool = False) -> list[str]:
        """The trainer's own check (`trainer.core.groups.group_problems`), freezing applied."""
        if not self.parameters:
            return []
        return group_problems([n for n, _ in self.parameters], [g["pattern"] for g in self.groups()], head,
                              freeze_backbone)

    def mark_errors(self, problems: list[str]) -> None:
        mine = [p for p in problems if p.startswith("optimizer.groups")]
        self.table.setStyleSheet(ERROR_STYLE if mine else "")
        self.table.setToolTip("\n".join(mine))
        self.problem.setText("\n".join(mine))
        self.problem.setVisible(bool(mine))


class OptimizerPage(QWidget):
    lrFindRequested = Signal()

    def __init__(self, binder: Binder, parent: QWidget | None = None):
        super().__init__(parent)
        b = binder
        self.binder = binder
        self.model = binder.model  # the form's values (the page shows the optimizer's)
        self._showing = False  # the groups are being shown from the model: their edits are not the user's
        opt = QGroupBox("Optimizer")
        of = QFormLayout(opt)
        of.addRow("Algorithm", b.combo("optimizer.name", key_choices("optimizer.name")))
        self.find_lr = QPushButton("Find…")
        self.find_lr.setObjectName("findLr")
        self.find_lr.setToolTip("Sweep the learning rate over a few hundred steps and suggest one")
        self.find_lr.clicked.connect(self.lrFindRequested)
        lr_row = QHBoxLayout()
        lr_row.addWidget(b.number("optimizer.lr"), 1)
        lr_row.addWidget(self.find_lr)
        of.addRow("Learning rate", lr_row)
        of.addRow("Momentum", b.number("optimizer.momentum"))
        of.addRow("Weight decay", b.number("optimizer.weight_decay"))

        self.groups = GroupsEditor()
        self.groups.changed.connect(self._groups_edited)
        self.model.listen(self._model_changed)
        groups_box = QGroupBox("Parameter groups (first matching pattern wins; the rest use the settings above)")
        QVBoxLayout(groups_box).addWidget(self.groups)

        sched = QGroupBox("Learning-rate schedule")
        sf = QFormLayout(sched)
        sf.addRow("Schedule", b.combo("scheduler.name", key_choices("scheduler.name")))
        sf.addRow("Warm-up epochs", b.dspin("scheduler.warmup_epochs"))
        sf.addRow("Step size (epochs)", b.spin("scheduler.step_size"))
        milestones = b.line("scheduler.milestones", "e.g. 30, 60")
        milestones.setProperty("kind", "int_list")
        sf.addRow("Milestones", milestones)
        sf.addRow("Gamma", b.number("scheduler.gamma"))

        loop, mon = self._build_loop_boxes(b)
        recipes = self._build_recipes(b)

        content = QWidget()
        grid = QGridLayout(content)
        grid.setContentsMargins(0, 0, 0, 0)
        scrolling(self, content)
        grid.addWidget(opt, 0, 0)
        grid.addWidget(sched, 0, 1)
        grid.addWidget(recipes, 1, 0, 1, 2)
        grid.addWidget(groups_box, 2, 0, 1, 2)
        grid.addWidget(loop, 3, 0)
        grid.addWidget(mon, 3, 1)
        grid.setRowStretch(2, 1)

    def _build_loop_boxes(self, b: Binder) -> tuple[QGroupBox, QGroupBox]:
        """The loss and loop settings, and monitoring and checkpoints."""
        loop = QGroupBox("Loss and loop")
        lf = QFormLayout(loop)
        lf.addRow("Loss", b.combo("loss.name", key_choices("loss.name")))
        lf.addRow("Label smoothing", b.dspin("loss.label_smoothing"))
        lf.addRow("Class weights", b.combo("loss.class_weights", key_choices("loss.class_weights")))
        lf.addRow("Epochs", b.spin("train.epochs"))
        lf.addRow("Gradient accumulation", b.spin("train.grad_accum_steps", " batches"))
        lf.addRow("Clip gradient norm", b.number("train.clip_grad_norm", "off"))
        lf.addRow("Seed", b.spin("train.seed"))
        lf.addRow("Non-finite loss", b.combo("train.on_nonfinite", key_choices("train.on_nonfinite")))

        mon = QGroupBox("Monitoring and checkpoints")
        mf = QFormLayout(mon)
        mf.addRow("Log every", b.spin("monitor.log_every", " steps"))
        mf.addRow(b.check("monitor.grad_stats", "Per-layer gradient statistics"))
        mf.addRow("MLflow", b.line("monitor.mlflow", "off; or a tracking server, e.g. http://127.0.0.1:5000"))
        mf.addRow("Checkpoint every", b.spin("checkpoint.every_epochs", " epochs"))
        mf.addRow("… and every", b.spin("checkpoint.every_steps", " steps"))
        mf.addRow("Keep last", b.spin("checkpoint.keep_last", " checkpoints"))
        return loop, mon

    def _build_recipes(self, b: Binder) -> QGroupBox:
        """The fine-tuning recipes, one button each (`trainer.core.recipes`), and the keys they set."""
        recipes = QGroupBox("Starting from pretrained weights: one click sets the keys")
        rf = QVBoxLayout(recipes)
        buttons = QHBoxLayout()
        self.recipe_buttons: dict[str, QPushButton] = {}
        for key, (label, tip) in RECIPES.items():
            button = QPushButton(label)
            button.setObjectName(f"recipe_{key}")
            button.setToolTip(tip)
            button.clicked.connect(lambda _=False, key=key: self.apply_recipe(key))
            buttons.addWidget(button)
            self.recipe_buttons[key] = button
        rf.addLayout(buttons)
        keys = QHBoxLayout()
        keys.addWidget(b.check("model.freeze_backbone", "Linear probe: train the head only"))
        keys.addSpacing(24)
        keys.addWidget(QLabel("Unfreeze the backbone after"))
        keys.addWidget(b.spin("model.unfreeze_at_epoch", " epochs"))
        keys.addStretch(1)
        rf.addLayout(keys)
        self.recipe_note = QLabel("")
        self.recipe_note.setObjectName("recipeNote")
        self.recipe_note.setWordWrap(True)
        self.recipe_note.setStyleSheet("color: #555;")
        rf.addWidget(self.recipe_note)
        return recipes

    @property
    def head(self) -> str | None:
        """The model's classifier head (from the Model page's describe-model); the groups editor's too."""
        return self.groups.head

    @head.setter
    def head(self, name: str | None) -> None:
        self.groups.head = name

    def apply_recipe(self, key: str) -> None:
        """Set the config keys of a fine-tuning recipe (`trainer.core.recipes`); what it did is said beside the buttons."""
        model = self.model
        lr = model.get("optimizer.lr")
        raw = {"model": {"freeze_backbone": bool(model.get("model.freeze_backbone")),
                         "unfreeze_at_epoch": model.get("model.unfreeze_at_epoch")},
               "optimizer": {"lr": lr if isinstance(lr, (int, float)) else None,
                             "groups": model.get("optimizer.groups") or []}}
        try:
            out = apply_recipe(key, raw, self.head)
        except RecipeError as e:
            self.recipe_note.setText(f"{RECIPES[key][0]}: {e}.")
            return
        by = f"the recipe {RECIPES[key][0]}"
        for section, name in (("model", "freeze_backbone"), ("model", "unfreeze_at_epoch"), ("optimizer", "groups"),
                              ("optimizer", "lr")):
            if out[section][name] != raw[section][name]:
                model.set(f"{section}.{name}", out[section][name], by)
        self.recipe_note.setText(f"{RECIPES[key][0]}: {RECIPES[key][1]}.")

    def _groups_edited(self) -> None:
        if not self._showing:
            self.model.set("optimizer.groups", self.groups.groups(), USER)

    def _model_changed(self, key: str | None, _by: str) -> None:
        if key in (None, "optimizer.groups") and self.groups.groups() != (self.model.get("optimizer.groups") or []):
            self._showing = True
            try:
                self.groups.set_groups(self.model.get("optimizer.groups") or [])
            finally:
                self._showing = False

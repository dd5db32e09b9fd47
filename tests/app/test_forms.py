"""The forms hold what the config holds (issue #51): a widget's limits are the config key's, so a valid value is never
rounded or clamped on its way through the forms (0.125 became 0.13, 0.02 became 0.05)."""

from pathlib import Path

from helpers import train_here, write_config
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox

from app.window.form import DEMO_CONFIG
from trainer.core.config import RunConfig, key_meta, load_config
from trainer.data.edits import get_path, set_path


def test_every_numeric_key_survives_the_forms_unchanged(qtbot, make_window, shapes_dir, tmp_path, monkeypatch):
    """Each widget shows its key's value so that what it reads back is that value (a user who does not touch it, or
    tabs through it, changes nothing), at the edges of every key's range."""
    from app.widgets.forms import read_value

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    window = make_window(write_config(tmp_path, shapes_dir))
    spins = {k: w for k, w in window.binder.widgets.items() if isinstance(w, (QSpinBox, QDoubleSpinBox))}
    assert {"data.val_split", "data.augment.crop_scale_min", "train.epochs", "scheduler.warmup_epochs"} <= set(spins)
    raw = window.model.raw()
    values = {"data.val_split": 0.125, "data.augment.crop_scale_min": 0.02, "scheduler.warmup_epochs": 0.25,
              "loss.label_smoothing": 0.005, "data.augment.color_jitter": 0.375,
              "train.seed": 2**32 - 1}  # past a Qt spin box's 32 bits: typed
    for key in spins:  # every other one at the edges the config allows
        meta = key_meta(key)
        values.setdefault(key, meta["le"] if meta["le"] is not None and meta["le"] < 2**31 else
                          meta["ge"] if meta["ge"] is not None else meta["default"])
    for key, value in values.items():
        set_path(raw, key, value)
    window.model.load(raw)
    read = {key: read_value(window.binder.widgets[key]) for key in values}
    changed = {k: (v, read[k]) for k, v in values.items() if read[k] != v}
    assert not changed, f"the forms changed valid values: {changed}"
    assert spins["data.val_split"].text() == "0.125", "shown as written"
    val_split = spins["data.val_split"]
    assert (val_split.minimum(), val_split.maximum()) == (0.000001, 0.999999), "the config's bounds: 0 < val_split < 1"
    for hflip, crop in (("auto", "auto"), (False, 0.5), (True, "auto")):  # the trainer's auto survives too
        set_path(raw, "data.augment.hflip", hflip)
        set_path(raw, "data.augment.crop_scale_min", crop)
        window.model.load(raw)
        widgets = window.binder.widgets
        assert (read_value(widgets["data.augment.hflip"]), read_value(widgets["data.augment.crop_scale_min"])) == (
            hflip, crop)
    assert spins["data.augment.crop_scale_min"].text() == "auto"


def test_every_numeric_key_survives_form_save_load_form_unchanged(qtbot, make_window, shapes_dir, tmp_path,
                                                                   monkeypatch):
    """Issue #70: 0.00123456789, 0.125 and 3e-4 (wherever a key allows them) and every key's default, entered in the
    form as a user enters them (typed into a text field, set in a spin box), go form -> Save (the YAML file) -> Open
    -> form unchanged, for every numeric key the forms hold, the learning rate included (0.00123456789 was shown and
    saved as 0.00123457)."""
    from PySide6.QtWidgets import QLineEdit

    from app.widgets.forms import format_number, read_value

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    window = make_window(write_config(tmp_path, shapes_dir))
    binder = window.binder
    numeric = {k for k, w in binder.widgets.items() if isinstance(w, (QSpinBox, QDoubleSpinBox))
               or isinstance(w, QLineEdit) and w.property("kind") in ("number", "int")}
    assert {"optimizer.lr", "optimizer.weight_decay", "data.val_split", "train.epochs"} <= numeric

    def allows(meta: dict, value) -> bool:
        return ((meta["ge"] is None or value >= meta["ge"]) and (meta["gt"] is None or value > meta["gt"])
                and (meta["le"] is None or value <= meta["le"]) and (meta["lt"] is None or value < meta["lt"]))

    def enter(key: str, value) -> None:
        widget = binder.widgets[key]
        if isinstance(widget, QLineEdit):
            widget.setText("" if value is None else "3e-4" if value == 3e-4 else format_number(value))  # as typed
        else:
            widget.setValue(widget.minimum() if value is None or isinstance(value, str) else value)

    defaults = RunConfig().to_dict()
    for value in (0.00123456789, 0.125, 3e-4, None):  # None: each key's default
        chosen = {}
        for key in sorted(numeric):
            meta = key_meta(key)
            if value is None:
                chosen[key] = get_path(defaults, key)
            elif isinstance(meta["default"], float) and allows(meta, value):
                chosen[key] = value
            else:
                continue
            enter(key, chosen[key])
        assert {k: window.model.get(k) for k in chosen} == chosen, "the form holds what was entered"
        path = tmp_path / f"saved-{value}.yaml"
        window.form.validate()
        window.files.save(path)
        assert window.files.open(path)
        back = {k: window.model.get(k) for k in chosen}
        shown = {k: read_value(binder.widgets[k]) for k in chosen}
        changed = {k: (v, back[k], shown[k]) for k, v in chosen.items() if back[k] != v or shown[k] != v}
        assert not changed, f"form -> Save -> Open -> form changed: {changed}"
        if value == 0.00123456789:
            assert binder.widgets["optimizer.lr"].text() == "0.00123456789", "shown as it is"
            assert len(chosen) >= 8, chosen
        if value == 3e-4:
            assert binder.widgets["optimizer.lr"].text() == "0.0003", "3e-4 as the config reads it"


def test_a_new_folder_leaves_nothing_of_the_last_folder_s_splits(qtbot, make_window, tmp_path, monkeypatch):
    """Training images set to a folder holding train/ val/ test/, then to a flat folder with other classes: its
    validation and test folders went on being used (the run validated and tested on the first dataset)."""
    import shutil

    from trainer.data.demo_data import write_demo_dataset

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    split = tmp_path / "split"
    for name, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_demo_dataset(split / name, per_class=6, size=16, seed=seed)
    flat = tmp_path / "flat"
    for old, new in (("circle", "round"), ("square", "boxy")):
        shutil.copytree(split / "train" / old, flat / new)
    window = make_window(write_config(tmp_path, split))
    val_dir = window.binder.widgets["data.val_dir"]
    qtbot.waitUntil(lambda: val_dir.text() == str(split / "val"), timeout=20_000)
    assert window.model.get("data.test_dir") == str(split / "test")
    window.binder.widgets["data.train_dir"].setText(str(flat))
    qtbot.waitUntil(lambda: val_dir.text() == "", timeout=20_000)
    assert window.model.get("data.test_dir") is None
    assert "the validation and test folder of the last one no longer applies" in window.statusBar().currentMessage()
    cfg = window.form.config()
    assert cfg.data.train_dir == str(flat) and cfg.data.val_dir is None and cfg.data.test_dir is None

    typed = tmp_path / "mine"  # a validation folder the user chose over the folder's own stays on a change
    shutil.copytree(flat, typed)
    window.binder.widgets["data.train_dir"].setText(str(split))
    qtbot.waitUntil(lambda: val_dir.text() == str(split / "val"), timeout=20_000)
    val_dir.setText(str(typed))
    window.binder.widgets["data.train_dir"].setText(str(flat))
    qtbot.waitUntil(lambda: window.model.get("data.test_dir") is None, timeout=20_000)
    assert val_dir.text() == str(typed), "what the user set is kept"


def test_new_keeps_the_dataset_even_when_it_does_not_make_a_valid_config_yet(qtbot, make_window, shapes_dir,
                                                                             tmp_path, monkeypatch):
    """New on a form with errors (a labels file beside a validation folder) cleared Training images and the labels
    file while the status bar said 'on the same dataset'."""
    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    window = make_window(write_config(tmp_path, shapes_dir))
    labels, val = str(tmp_path / "labels.csv"), str(tmp_path / "val")
    window.binder.widgets["data.labels"].setText(labels)
    window.binder.widgets["data.val_dir"].setText(val)
    window.binder.widgets["train.epochs"].setValue(7)
    window.form.new()
    assert window.binder.widgets["data.train_dir"].text() == str(shapes_dir)
    assert (window.binder.widgets["data.labels"].text(), window.binder.widgets["data.val_dir"].text()) == (labels, val)
    first_start = load_config(DEMO_CONFIG)  # issue #71: New gave batch 64 where the first start gave 32
    assert window.binder.widgets["train.epochs"].value() == first_start.train.epochs, "every other setting: a first start's"
    assert window.binder.widgets["data.batch_size"].value() == first_start.data.batch_size
    qtbot.waitUntil(lambda: any(p.startswith("data.val_dir") for p in window.form.problems), timeout=10_000)


def test_opening_a_past_run_says_it_replaced_the_form_and_puts_it_back(qtbot, make_window, shapes_dir, tmp_path,
                                                                      monkeypatch):
    """Opening a run from Runs loaded its settings into the forms without a word: the next Start trained its dataset.
    What the trainer decided for that run's folder (data.augment's auto values) is auto again in the form."""
    import shutil

    import yaml

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    other = tmp_path / "other"
    shutil.copytree(shapes_dir, other)
    (tmp_path / "past").mkdir()
    past = write_config(tmp_path / "past", other, data={"image_size": 16, "augment": {"crop_scale_min": 0.7}},
                        train={"epochs": 1})
    run, code = train_here(past, tmp_path / "runs")  # config.yaml: what auto became for its folder (flips on)
    assert code == 0 and yaml.safe_load(run.config.read_text())["data"]["augment"]["hflip"] is True
    window = make_window(write_config(tmp_path, shapes_dir, train={"epochs": 9}), runs_dir=tmp_path / "runs")
    window.run_actions.open(str(run.path))
    assert window.binder.widgets["data.train_dir"].text() == str(other)
    augment = window.form.config().data.augment
    assert (augment.hflip, augment.crop_scale_min) == ("auto", 0.7), "decided for its folder: auto again; set: kept"
    assert window.binder.widgets["train.epochs"].value() == 1
    assert window.form.restore_button.isVisible() and run.name in window.form.restore_button.text()
    window.form.restore_button.click()
    assert window.binder.widgets["data.train_dir"].text() == str(shapes_dir)
    assert window.binder.widgets["train.epochs"].value() == 9 and not window.form.restore_button.isVisible()


def test_the_form_s_rules_hold_without_a_window(tmp_path):
    """app/state/form_model.py, Qt-free: values as given and who set them; a labels file sets its loss; New keeps the
    dataset (a labels file its loss); a folder laid out as train/ val/ test/ gives its splits, and a new folder clears
    only the splits the last one gave and still holds; each dataset has its own manifest name."""
    from app.state.form_model import LAYOUT, USER, FormModel, manifest_path_for
    from trainer.data.edits import new_config_raw

    heard = []
    model = FormModel()
    model.listen(lambda key, by: heard.append((key, by)))
    assert model.set("optimizer.lr", 0.00123456789) and model.get("optimizer.lr") == 0.00123456789
    assert not model.set("optimizer.lr", 0.00123456789), "the same value: no change, nobody told"
    model.set("data.labels", "/d/labels.csv", "the labels file")
    assert model.get("loss.name") != RunConfig().loss.name and model.set_by["loss.name"] == "the labels file"
    assert heard == [("optimizer.lr", USER), ("data.labels", "the labels file"), ("loss.name", "the labels file")]
    model.set("data.labels", None)
    assert model.get("loss.name") == RunConfig().loss.name, "cleared: the default loss is back"

    current = RunConfig().to_dict()
    current["data"].update(train_dir="/d/train", val_dir="/d/val", labels="/d/labels.csv")
    current["optimizer"]["lr"] = 0.5
    start = RunConfig().to_dict()
    start["data"]["batch_size"] = 32
    raw = new_config_raw(current, start)
    assert raw["data"]["train_dir"] == "/d/train" and raw["data"]["labels"] == "/d/labels.csv"
    assert raw["optimizer"]["lr"] == RunConfig().optimizer.lr and raw["loss"]["name"] != RunConfig().loss.name
    assert raw["data"]["batch_size"] == 32 and start["data"]["train_dir"] != "/d/train"

    split, flat = tmp_path / "split", tmp_path / "flat"
    for folder in (split / "train" / "a", split / "val" / "a", split / "test" / "a", flat / "a"):
        folder.mkdir(parents=True)
    model = FormModel()
    model.set("data.train_dir", str(split))
    said = model.settle_folder(str(split))
    assert (model.get("data.train_dir"), model.get("data.val_dir"), model.get("data.test_dir")) == (
        str(split / "train"), str(split / "val"), str(split / "test")) and "train/, val/, test/" in said
    assert model.set_by["data.val_dir"] == LAYOUT
    assert model.settle_folder(str(split / "train")) == "", "the folder it gave, settled again: nothing changes"
    model.set("data.test_dir", "/mine/test")  # the user's own test folder
    model.set("data.train_dir", str(flat))
    assert "validation folder of the last one" in model.settle_folder(str(flat))
    assert (model.get("data.val_dir"), model.get("data.test_dir")) == ("", "/mine/test"), "the user's stays"
    assert model.settle_folder(str(split / "val")) == "" and model.get("data.test_dir") == "/mine/test"
    assert model.settle_folder(str(split), local=False) == "", "a host's folder: its scan there says"

    first, second = manifest_path_for("/a/cats", tmp_path, None), manifest_path_for("/b/cats", tmp_path, None)
    assert first != second and first.parent == second.parent == tmp_path / "configs"
    assert manifest_path_for("/a/cats", tmp_path, tmp_path / "mine.yaml") == tmp_path / "mine.exclude.yaml"


def test_the_augmentation_preview_follows_the_settings_as_the_trainer_draws_them(qtbot, make_window, shapes_dir,
                                                                                 tmp_path):
    """The Dataset page shows training images as the network will see them (issue #47): drawn by the trainer for
    the form's settings, drawn again when an augmentation setting changes, and other draws on Draw again."""
    window = make_window(write_config(tmp_path, shapes_dir))
    preview = window.dataset_page.preview
    qtbot.waitUntil(lambda: preview.result is not None, timeout=60_000)
    first = preview.result
    assert first["augment"]["hflip"] is True and first["augment"]["color_jitter"] == 0, "the trainer's auto: shapes"
    assert preview.tiles.count() == len(first["images"]) * 5 == 20, "each image as decoded, then 4 draws"
    assert "no colour jitter" in preview.caption.text()
    window.binder.widgets["data.augment.color_jitter"].setValue(0.4)
    qtbot.waitUntil(lambda: preview.result["augment"]["color_jitter"] == 0.4, timeout=60_000)
    assert "colour jitter 0.4" in preview.caption.text()
    assert not Path(first["images"][0]["original"]).parent.exists(), "the previous drawing's files go"
    window.binder.widgets["optimizer.lr"].setText("0.2")  # not a setting the preview depends on: not drawn again
    asked = preview._asks
    qtbot.wait(500)
    assert preview._asks == asked and preview.job is None
    jittered = preview.result
    preview.again.click()
    qtbot.waitUntil(lambda: preview.result is not jittered, timeout=60_000)
    assert preview.result["seed"] == 1
    assert [r["path"] for r in preview.result["images"]] != [r["path"] for r in jittered["images"]], "other images"


def test_the_wheel_scrolls_past_values_it_has_not_been_given_and_ctrl_q_quits(qtbot, make_window, shapes_dir, tmp_path,
                                                                                monkeypatch):
    """Issue #71: scrolling the Dataset page across Batch size changed it (32 to 24); a value takes the wheel only
    once clicked or tabbed into. Ctrl+Q closes the window as closing it does; the question asked when a run is in
    progress defaults to Cancel (Enter left the trainer running)."""
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QKeySequence, QWheelEvent
    from PySide6.QtWidgets import QApplication, QMessageBox

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    window = make_window(write_config(tmp_path, shapes_dir, data={"batch_size": 32}))
    batch = window.binder.widgets["data.batch_size"]
    assert batch.focusPolicy() == Qt.FocusPolicy.StrongFocus

    def wheel(widget, notches: int) -> None:
        centre = QPointF(widget.rect().center())
        event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0),
                            QPoint(0, 120 * notches), Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                            Qt.ScrollPhase.NoScrollPhase, False)
        QApplication.sendEvent(widget, event)

    window.binder.widgets["train.epochs"].setFocus()
    wheel(batch, -3)
    assert batch.value() == 32, "not given the wheel: the page scrolls past it"
    batch.setFocus()
    qtbot.waitUntil(batch.hasFocus, timeout=5_000)
    wheel(batch, 1)
    assert batch.value() != 32, "clicked into, the wheel changes it"

    assert window.quit_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Quit)
    window._ask_how_to_close()
    assert window.close_box.defaultButton() is window.close_box.button(QMessageBox.StandardButton.Cancel)
    window.close_box.done(0)
    window.quit_action.trigger()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5_000)


def test_clearing_the_labels_file_after_choosing_asl_leaves_a_config_the_trainer_takes(qtbot, make_window, shapes_dir,
                                                                                        tmp_path, monkeypatch):
    """Issue #70: a labels file set the loss to bce; the user chose asl, then cleared the labels file: asl stayed (only
    bce was put back), a config the trainer refuses. The rule is the trainer's (`loss_for_labels`), one copy."""
    from trainer.core.config import MULTILABEL_LOSS, loss_for_labels

    assert [loss_for_labels(True, "cross_entropy"), loss_for_labels(True, "asl"), loss_for_labels(False, "asl"),
            loss_for_labels(False, "mse")] == [MULTILABEL_LOSS, "asl", RunConfig().loss.name, "mse"]
    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    window = make_window(write_config(tmp_path, shapes_dir))
    loss = window.binder.widgets["loss.name"]
    window.binder.widgets["data.labels"].setText(str(tmp_path / "labels.csv"))
    assert loss.currentText() == MULTILABEL_LOSS
    loss.setCurrentText("asl")
    window.binder.widgets["data.labels"].setText("")
    assert loss.currentText() == RunConfig().loss.name
    cfg = window.form.config()
    assert cfg is not None and cfg.loss.name == RunConfig().loss.name, window.form.problems


def test_a_chosen_folder_reaches_the_form_model_once_and_is_scanned_once(qtbot, make_window, shapes_dir, tmp_path,
                                                                         monkeypatch):
    """Issue #70: the folder went page -> window -> page (the window wrote data.train_dir back into the widget, the
    page scanned again). Chosen with Browse…, a folder laid out as train/ val/ test/ reaches the form model once (the
    user's choice), its splits are set by the model's rule (nothing else writes them), and the folder is scanned once."""
    from PySide6.QtWidgets import QFileDialog, QPushButton

    from app.pages import dataset_page
    from app.state.form_model import LAYOUT, USER
    from app.window.form import DATASET_MANIFEST
    from trainer.data.demo_data import write_demo_dataset

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    split = tmp_path / "split"
    for name, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_demo_dataset(split / name, per_class=6, size=16, seed=seed)
    window = make_window(write_config(tmp_path, shapes_dir))
    page = window.dataset_page
    qtbot.waitUntil(lambda: page.scan_result is not None, timeout=20_000)
    sets, scans = [], []
    model_set = window.model.set
    monkeypatch.setattr(window.model, "set", lambda key, value, by=USER: (sets.append((key, value, by)),
                                                                          model_set(key, value, by))[1])
    scan = dataset_page._scan_with_thumbnails
    monkeypatch.setattr(dataset_page, "_scan_with_thumbnails", lambda folder, *a: (scans.append(folder),
                                                                                   scan(folder, *a))[1])
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(split))
    page.findChild(QPushButton, "browse:data.train_dir").click()
    qtbot.waitUntil(lambda: page.scan_result is not None and page.scan_result.root == str(split / "train"),
                    timeout=20_000)
    qtbot.wait(800)  # past the page's debounce: no second scan comes
    assert scans == [str(split / "train")], "scanned once, the layout's train/"
    chosen = [(key, value) for key, value, by in sets if by == USER]
    assert chosen == [("data.train_dir", str(split))], "the user's choice reached the model once"
    assert {by for _, _, by in sets} <= {USER, LAYOUT, DATASET_MANIFEST}, sets
    widgets = window.binder.widgets
    assert (widgets["data.train_dir"].text(), widgets["data.val_dir"].text()) == (str(split / "train"),
                                                                                 str(split / "val"))
    assert window.form.config().data.test_dir == str(split / "test")
    assert "train/, val/, test/" in window.statusBar().currentMessage()

"""The Export dialog exports through `main.py export` and shows every export of the folder side by side with its
model card's numbers; int8's calibration folder is offered for int8 only; refusals are shown in the dialog."""

import json

import pytest
from helpers import train_here, write_config
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QPushButton

from app.dialogs.export_dialog import COLUMNS, ExportDialog


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, shapes_dir):
    tmp = tmp_path_factory.mktemp("export-dialog")
    cfg = write_config(tmp, shapes_dir, data={"image_size": 24}, train={"epochs": 2})
    run, code = train_here(cfg, tmp / "runs")
    assert code == 0
    return run


def export(qtbot, dialog: ExportDialog, fmt: str) -> None:
    dialog.format.setCurrentIndex(dialog.format.findData(fmt))
    dialog.export()
    qtbot.waitUntil(lambda: dialog.job is None, timeout=120_000)


@pytest.mark.slow
def test_exports_are_compared_side_by_side_with_their_cards_numbers(qtbot, finished_run, tmp_path, monkeypatch):
    dialog = ExportDialog(str(finished_run.path))
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.out.setText(str(tmp_path / "exports" / "model.pt2"))
    dialog.refresh()
    assert dialog.table.rowCount() == 0 and "No exports" in dialog.compared.text()
    assert not dialog.calibration_row.isEnabled(), "calibration is int8's alone"
    format_at = dialog.format.mapToGlobal(dialog.format.rect().topLeft())
    export(qtbot, dialog, "onnx")
    assert "exported" in dialog.result.text() and "top-1" in dialog.result.text()
    dialog.format.setCurrentIndex(dialog.format.findData("onnx_int8"))
    assert dialog.calibration_row.isEnabled() and dialog.out.text().endswith("model.int8.onnx")
    assert dialog.format.mapToGlobal(dialog.format.rect().topLeft()) == format_at, "the format list stays put"
    assert "int8" in dialog.about.text()
    export(qtbot, dialog, "onnx_int8")
    rows = {dialog.table.item(r, 0).text(): [dialog.table.item(r, c).text() for c in range(len(COLUMNS))]
            for r in range(dialog.table.rowCount())}
    assert set(rows) == {"model.onnx", "model.int8.onnx"}
    for name, cells in rows.items():  # what the card says, as the dialog shows it
        card = json.loads((tmp_path / "exports" / f"{name}.json").read_text())
        assert cells[COLUMNS.index("format")] == card["format"]
        assert cells[COLUMNS.index("size")] == f"{card['file']['bytes'] / 1e3:.1f} kB"
        assert cells[COLUMNS.index("top-1")] == f"{100 * card['metrics']['top1']:.1f}%"
        assert cells[COLUMNS.index("agreement")] == f"{100 * card['metrics']['agreement']:.1f}%"
        assert cells[COLUMNS.index("batch 1")] == f"{card['speed']['batch1_ms']:.2f} ms"
        assert cells[COLUMNS.index("measured on")] == f"val split, {card['metrics']['images']} images"
    assert dialog.table.item(dialog.table.currentRow(), 0).text() == "model.int8.onnx", "the new export selected"
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()))
    dialog.card_button.click()  # shown here: a system may have no viewer for .md
    card = dialog.card_dialog
    assert card.isVisible() and "model.int8.onnx" in card.windowTitle() and "int8" in card.view.toPlainText()
    assert opened == []
    next(b for b in card.findChildren(QPushButton) if b.text() == "Open in another app").click()
    assert opened == [str(tmp_path / "exports" / "model.int8.onnx.md")]
    card.close()

    # an export that exists is replaced only when the user says so
    dialog.format.setCurrentIndex(dialog.format.findData("onnx"))
    dialog.out.setText(str(tmp_path / "exports" / "model.onnx"))
    before = (tmp_path / "exports" / "model.onnx").stat().st_mtime_ns
    dialog.export()
    assert dialog.job is None and dialog.replace_box.isVisible(), "asked first"
    dialog.replace_box.reject()
    assert dialog.job is None and (tmp_path / "exports" / "model.onnx").stat().st_mtime_ns == before
    dialog.format.setCurrentIndex(dialog.format.findData("onnx_int8"))

    empty = tmp_path / "empty"
    empty.mkdir()
    dialog.calibration.setText(str(empty))
    dialog.out.setText(str(tmp_path / "exports" / "other.int8.onnx"))
    export(qtbot, dialog, "onnx_int8")
    assert f"--calibration: {empty}: no images in it" in dialog.result.text()
    assert dialog.table.rowCount() == 2 and not (tmp_path / "exports" / "other.int8.onnx").exists()
    dialog.close()

"""The architecture's two rules: trainer/ never imports Qt or app/; app/ uses only torch-free trainer modules."""

import ast
import subprocess
import sys

from helpers import REPO

TORCH_FREE = {"trainer.config", "trainer.events", "trainer.rundir", "trainer.scan", "trainer.groups",
              "trainer.launch", "trainer.demo_data", "trainer.catalog", "trainer.devices", "trainer.manifest",
              "trainer.queue", "trainer.schedule", "trainer.sweep", "trainer.standby", "trainer.errors",
              "trainer.files", "trainer.system", "trainer.recipes",
              "trainer.csvfile", "trainer.suggest", "trainer.hosts", "trainer.mirror", "trainer.ssh", "trainer.model_card"}


def imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_trainer_never_imports_qt_or_app():
    for path in (REPO / "trainer").rglob("*.py"):
        bad = [m for m in imports(path) if m.split(".")[0] in ("PySide6", "pyqtgraph", "app")]
        assert not bad, f"{path.name} imports {bad}"


def test_app_imports_only_torch_free_trainer_modules():
    for path in (REPO / "app").rglob("*.py"):
        for module in imports(path):
            assert module.split(".")[0] not in ("torch", "torchvision"), f"{path.name} imports {module}"
            if module.startswith("trainer"):
                assert module in TORCH_FREE, f"{path.name} imports {module}"


def test_torch_free_modules_really_are():
    code = f"import sys; import {', '.join(sorted(TORCH_FREE))}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip() == "False", result.stderr

"""The architecture, checked from the code itself (no hand-kept list of modules):

- trainer/ is packages in an order, bottom to top; an import never runs from a package to one above it, and no
  module imports itself back through others (no circle);
- trainer/ never imports Qt or app/;
- app/ imports only the trainer modules that are torch-free, and a module is torch-free when nothing it imports at
  load time (its own top-level imports, followed through trainer/) is torch or torchvision;
- app/ is floors in an order too (state, jobs, widgets, dialogs, pages, training, window; then the main window and
  the entry point), with no import up a floor and no circle, and its state floor never imports Qt.
"""

import ast
import subprocess
import sys

from helpers import REPO

ORDER = ["core", "data", "model", "device", "deploy", "train", "runs", "remote"]  # bottom to top; then TOP
TOP = ["auto", "cli"]  # the CLI dispatches to Auto
HEAVY = ("torch", "torchvision")


def module_name(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def trainer_modules() -> dict[str, object]:
    return {module_name(p): p for p in (REPO / "trainer").rglob("*.py")}


def imports(path, top_level_only: bool = False):
    """The modules a file imports (`from X import y` also as X.y, which may be a module)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)
        elif top_level_only and isinstance(node, (ast.If, ast.Try)):  # imports guarded at load time count too
            for child in ast.walk(node):
                if isinstance(child, ast.Import):
                    yield from (a.name for a in child.names)
                elif isinstance(child, ast.ImportFrom) and child.module:
                    yield child.module


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # trainer/__init__.py: loaded before every trainer module, it may import only the core
        return 0
    if parts[1] in ORDER:
        return ORDER.index(parts[1])
    return len(ORDER) + (TOP.index(parts[1]) if parts[1] in TOP else 0)


def test_every_trainer_module_is_in_a_package_of_the_order():
    loose = [m for m in trainer_modules() if m.count(".") == 1 and m.split(".")[1] not in TOP + ORDER]
    assert not loose, f"modules outside the packages: {loose}"
    assert sorted({m.split(".")[1] for m in trainer_modules() if m.count(".") == 2}) == sorted(ORDER)


def test_no_import_runs_up_the_layers():
    modules = trainer_modules()
    upward = []
    for name, path in modules.items():
        for target in imports(path):
            if target in modules and target != "trainer" and layer(target) > layer(name):
                upward.append(f"{name} -> {target}")
    assert not upward, upward


def assert_no_circle(graph: dict[str, set[str]]) -> None:
    """Depth first through the import graph: a module met again on the way down is a circle."""
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError(f"import circle: {' -> '.join(trail[trail.index(nxt):] + [nxt])}")
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_no_import_circle():
    modules = trainer_modules()
    assert_no_circle({name: {t for t in imports(path) if t in modules and t != name and t != "trainer"}
                      for name, path in modules.items()})


def torch_free() -> set[str]:
    """The trainer modules whose load-time imports, followed through trainer/, never reach torch."""
    modules = trainer_modules()
    loads = {name: {t for t in imports(path, top_level_only=True)} for name, path in modules.items()}
    heavy: dict[str, bool] = {}

    def is_heavy(name, seen=()):
        if name in heavy:
            return heavy[name]
        found = False
        for target in loads[name]:
            if target.split(".")[0] in HEAVY:
                found = True
            elif target in modules and target not in seen and target != name:
                found = is_heavy(target, seen + (name,))
            if found:
                break
        heavy[name] = found
        return found

    return {name for name in modules if not is_heavy(name)}


def test_trainer_never_imports_qt_or_app():
    for path in (REPO / "trainer").rglob("*.py"):
        bad = [m for m in imports(path) if m.split(".")[0] in ("PySide6", "pyqtgraph", "app")]
        assert not bad, f"{path.name} imports {bad}"


def test_app_imports_only_torch_free_trainer_modules():
    free, modules = torch_free(), trainer_modules()
    assert "trainer.core.config" in free and "trainer.train.engine" not in free  # the derivation sees both kinds
    for path in (REPO / "app").rglob("*.py"):
        for module in imports(path, top_level_only=False):
            assert module.split(".")[0] not in HEAVY, f"{path.name} imports {module}"
            if module in modules:
                assert module in free, f"{path.name} imports {module}, which loads torch"


def test_the_core_package_is_torch_free_and_the_derived_set_really_is():
    free = torch_free()
    core = {m for m in trainer_modules() if m.startswith("trainer.core.")}
    assert core <= free, core - free
    code = f"import sys; import {', '.join(sorted(free))}; print(sorted(m for m in {HEAVY} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip() == "[]", result.stderr[-2000:]


# ---- app/: floors, bottom to top; then the window's parts, the main window and the entry point ----------------------
APP_FLOORS = ["state", "jobs", "widgets", "dialogs", "pages", "training", "window"]
APP_TOP = ["main_window", "main"]
QT = ("PySide6", "pyqtgraph")


def app_modules() -> dict[str, object]:
    return {module_name(p): p for p in (REPO / "app").rglob("*.py")}


def app_floor(module: str) -> int:
    part = module.split(".")[1]
    return APP_FLOORS.index(part) if part in APP_FLOORS else len(APP_FLOORS) + APP_TOP.index(part)


def test_every_app_module_is_on_a_floor():
    loose = [m for m in app_modules() if m.count(".") == 1 and m.split(".")[1] not in APP_TOP + APP_FLOORS]
    assert not loose, f"app modules outside the floors: {loose}"
    assert sorted({m.split(".")[1] for m in app_modules() if m.count(".") == 2}) == sorted(APP_FLOORS)


def test_no_app_import_runs_up_a_floor_or_in_a_circle():
    modules = app_modules()
    graph = {name: {t for t in imports(path) if t in modules and t != name and t.count(".") >= 1}
             for name, path in modules.items()}
    upward = [f"{name} -> {t}" for name, targets in graph.items() for t in targets if app_floor(t) > app_floor(name)]
    assert not upward, upward
    assert_no_circle(graph)


def test_the_app_state_floor_is_qt_free():
    """What the app holds and derives (a run's series, its results, the experiments, the form's rules) is tested
    without a window: it never imports Qt."""
    for name, path in app_modules().items():
        if name.startswith("app.state."):
            bad = [m for m in imports(path) if m.split(".")[0] in QT]
            assert not bad, f"{name} imports {bad}"


LONGEST_FUNCTION = 60  # lines, in app/ and trainer/train/ (issue #70): a longer one does more than one thing
LOOP_METHODS = 15  # the training loop asks its policies (budget, epoch plan, validation); it does not hold them


def test_no_function_in_the_app_or_the_training_loop_is_longer_than_a_screen():
    long = []
    for root in ("app", "trainer/train"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LONGEST_FUNCTION:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)
    loop = next(node for node in ast.parse((REPO / "trainer/train/loop.py").read_text()).body
                if isinstance(node, ast.ClassDef) and node.name == "Loop")
    methods = [node.name for node in loop.body if isinstance(node, ast.FunctionDef)]
    assert len(methods) < LOOP_METHODS, methods


VALUE_SETTERS = {"setText", "setValue", "setChecked", "setCurrentText", "setCurrentIndex", "setPlainText"}
HELPER_FLOORS = ("app/pages", "app/window")  # the set-up pages and the window's helpers


def writes_a_bound_widget(node) -> bool:
    """`...widgets[KEY].setText(...)` and the like: a value written into a form widget past the form model."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in VALUE_SETTERS
            and isinstance(node.func.value, ast.Subscript) and isinstance(node.func.value.value, ast.Attribute)
            and node.func.value.value.attr == "widgets")


def test_the_form_s_values_are_the_model_s_and_no_helper_receives_the_window():
    """Issue #70: a page or window helper sets a value through the form model (`model.set(key, value, by)`), never
    by writing it into a bound widget (the Binder, app/widgets/forms.py, is the one view that shows values); a page
    or window helper is given what it needs (the model, the pages, the runs), never the whole window to reach into."""
    writes, given_window = [], []
    for path in (REPO / "app").rglob("*.py"):
        relative = str(path.relative_to(REPO))
        if relative == "app/widgets/forms.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if writes_a_bound_widget(node):
                writes.append(f"{relative}:{node.lineno}")
            if not relative.startswith(HELPER_FLOORS):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "window" in [
                    a.arg for a in node.args.args + node.args.kwonlyargs]:
                given_window.append(f"{relative}:{node.lineno} {node.name}(window)")
            if (isinstance(node, ast.Attribute) and node.attr == "window" and isinstance(node.value, ast.Name)
                    and node.value.id == "self"):
                given_window.append(f"{relative}:{node.lineno} self.window")
            if relative.startswith("app/window") and isinstance(node, ast.Attribute) and node.attr in ("binder",
                                                                                                     "widgets"):
                writes.append(f"{relative}:{node.lineno} .{node.attr} (a window helper goes through the model)")
    assert not writes, f"values written into form widgets past the model: {writes}"
    assert not given_window, given_window


LIMIT_SETTERS = {"setRange", "setMinimum", "setMaximum", "setSingleStep", "setSpecialValueText", "setDecimals"}
CHOICE_TAKERS = {"addItems", "combo", "choice"}


def literal(node) -> bool:
    """A number past 0 and 1, or a string: a value written into the code rather than asked of its owner."""
    return isinstance(node, ast.Constant) and (isinstance(node.value, str) or isinstance(node.value, (int, float))
                                               and not isinstance(node.value, bool) and node.value not in (0, 1))


def test_the_forms_and_dialogs_keep_no_limit_or_choice_list_of_a_trainer_rule():
    """Issue #70: a spin box's limits, step and special text, and a list of choices, come from the key's owner
    (`key_meta`, `key_choices`, the catalog's constants), never written out in a page or a dialog (the labelling
    dialog's 1-500 and the sweep seed's 2^31-1 were copies that went stale)."""
    found = []
    for root in ("app/pages", "app/dialogs"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                args = node.args
                if node.func.attr in LIMIT_SETTERS and any(literal(a) for a in args):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.attr}")
                if node.func.attr in CHOICE_TAKERS and any(
                        isinstance(a, (ast.List, ast.Tuple)) and len(a.elts) > 1 and all(literal(e) for e in a.elts)
                        for a in args):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.attr}([...])")
    assert not found, found


PROCESS_NAMES = {"subprocess", "multiprocessing", "pty", "QProcess", "Popen", "startDetached"}
OS_PROCESS_CALLS = ("system", "popen", "fork", "forkpty", "exec", "spawn", "posix_spawn")  # os.<one of these>...


def process_names(node) -> list[str]:
    """What a node names that starts a process: an imported module or class, or an os function."""
    if isinstance(node, ast.Import):
        return [a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module.split(".")[0], *(a.name for a in node.names)]
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr.startswith(OS_PROCESS_CALLS):
            return ["subprocess"]  # counted as one
        return [node.attr]
    return [node.id] if isinstance(node, ast.Name) else []


def test_the_app_starts_processes_only_through_its_jobs_floor():
    """Every command the app runs goes through app/jobs (CliJob, ResidentWorker, TrainerProcess, start_detached,
    run_to_end): no other module imports subprocess or names a way to start a process (issue #70)."""
    found = []
    for path in (REPO / "app").rglob("*.py"):
        if path.parent.name == "jobs":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            found += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in process_names(node)
                      if name in PROCESS_NAMES]
    assert not found, "\n".join(found)


def test_every_main_py_command_line_is_built_in_launch_py():
    """`main.py` command lines come from trainer/runs/launch.py's builders (`*_args`, `*_command`): nothing else
    calls main_command with a command's name written out (issue #70: four places in the trainer did)."""
    found = []
    for root in ("app", "trainer"):
        for path in (REPO / root).rglob("*.py"):
            if path == REPO / "trainer/runs/launch.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                        in ("main_command", "CliJob") and node.args and isinstance(node.args[0], (ast.Constant,
                                                                                                  ast.List))):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


RUN_FILE_NAMES = ("metrics.json", "predictions.csv", "best.pt", "last.pt", "checkpoints", "configs", ".pending",
                  "scheduler.log", "status.json", "events.jsonl", "events.summary.jsonl", "train.log", "output.log",
                  "auto.json", "exclude.yaml", "mlflow.json", "eval", "exports")


def test_the_app_names_no_run_folder_file_the_trainer_owns():
    """Run-folder paths come from RunDir and the runs folder's helpers (trainer/core/rundir.py, queue.py), never a
    file name joined by hand in app/ (issue #70: 22 places did)."""
    found = []
    for path in (REPO / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in RUN_FILE_NAMES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert not found, "\n".join(found)


def test_the_app_keeps_no_list_of_run_states():
    """Which states are live, unfinished, resumable or retryable is the trainer's (rundir.py's STATES and its
    groups, queue.RETRYABLE_STATES): app/ spells out no list of them (issue #70: 4 files did)."""
    from trainer.core.rundir import STATES

    found = []
    for path in (REPO / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                states = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in STATES]
                if len(states) >= 2:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {states}")
    assert not found, "\n".join(found)

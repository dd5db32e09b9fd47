"""Bad input from outside: each exits 2 with a message naming the key or file, never a traceback, and what can
be checked before launch leaves no run directory behind."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from helpers import REPO, run_here, train_here, wait_for_event, write_config
from PIL import Image

from trainer import cli
from trainer.core.events import read_events
from trainer.core.rundir import RunDir


def _config(tmp_path, shapes_dir, **sections):
    return write_config(tmp_path, shapes_dir, **sections)


def case_missing_folder(tmp_path, shapes_dir):
    return _config(tmp_path, shapes_dir, data={"train_dir": str(tmp_path / "nope")}), "nope: folder does not exist"


def case_folder_is_a_file(tmp_path, shapes_dir):
    (tmp_path / "file.txt").write_text("x")
    return _config(tmp_path, shapes_dir, data={"train_dir": str(tmp_path / "file.txt")}), "file.txt: not a folder"


def case_no_class_folders(tmp_path, shapes_dir):
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(next(shapes_dir.glob("circle/*.png")), flat / "a.png")
    return _config(tmp_path, shapes_dir, data={"train_dir": str(flat)}), "flat: no class sub-folders"


def case_val_classes_differ(tmp_path, shapes_dir):
    val = tmp_path / "val"
    shutil.copytree(shapes_dir, val)
    shutil.rmtree(val / "cross")
    return (_config(tmp_path, shapes_dir, data={"val_dir": str(val)}),
            "data.val_dir: " + str(val) + " has different classes from data.train_dir (only in train: ['cross']")


def case_test_classes_differ(tmp_path, shapes_dir):
    test = tmp_path / "test"
    shutil.copytree(shapes_dir, test)
    shutil.rmtree(test / "square")
    return (_config(tmp_path, shapes_dir, data={"test_dir": str(test)}),
            "data.test_dir: " + str(test) + " has different classes from data.train_dir (only in train: ['square']")


def case_unknown_model(tmp_path, shapes_dir):
    return _config(tmp_path, shapes_dir, model={"name": "resnet1"}), "model.name: unknown model 'resnet1'"


def case_unknown_weights(tmp_path, shapes_dir):
    return (_config(tmp_path, shapes_dir, model={"weights": str(tmp_path / "missing.pt")}),
            "model.weights: " + str(tmp_path / "missing.pt") + " does not exist")


def case_weights_of_another_architecture(tmp_path, shapes_dir):
    torch.save({"conv.weight": torch.zeros(3, 3, 3, 3)}, tmp_path / "other.pt")
    return (_config(tmp_path, shapes_dir, model={"weights": str(tmp_path / "other.pt")}),
            "other.pt does not fit this model")


def case_yaml_list(tmp_path, shapes_dir):
    path = tmp_path / "list.yaml"
    path.write_text("- data\n- model\n")
    return path, "list.yaml: config: must be a mapping"


def case_python_tag(tmp_path, shapes_dir):
    path = tmp_path / "tag.yaml"
    path.write_text("data: !!python/object/apply:os.system ['echo pwned']\n")
    return path, "tag.yaml: invalid YAML at line 1"


def case_binary_config(tmp_path, shapes_dir):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    return path, "bin.yaml: not a text (UTF-8) YAML file"


def case_wrong_types(tmp_path, shapes_dir):
    return _config(tmp_path, shapes_dir, data={"batch_size": "big"}), "data.batch_size: must be an integer, got 'big'"


def case_seed_out_of_range(tmp_path, shapes_dir):
    return _config(tmp_path, shapes_dir, train={"seed": 2**63}), "train.seed: must be <= 4294967295"


CASES = [case_missing_folder, case_folder_is_a_file, case_no_class_folders, case_val_classes_differ,
         case_test_classes_differ, case_unknown_model, case_unknown_weights, case_weights_of_another_architecture, case_yaml_list,
         case_python_tag, case_binary_config, case_wrong_types, case_seed_out_of_range]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_bad_input_exits_2_naming_it_without_a_traceback_or_a_run_directory(case, tmp_path, shapes_dir, capsys):
    config, expected = case(tmp_path, shapes_dir)
    runs = tmp_path / "runs"
    code = cli.main(["train", str(config), "--runs-dir", str(runs)])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert expected in err, err
    assert "Traceback" not in out + err
    assert not runs.exists(), "nothing was created for an input refused before launch"


def test_bad_input_from_a_real_process_prints_one_line(tmp_path, shapes_dir):
    missing, missing_text = case_missing_folder(tmp_path, shapes_dir)
    binary, binary_text = case_binary_config(tmp_path, shapes_dir)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_bytes(binary.read_bytes())
    for args, expected in ((("train", missing), missing_text), (("lr-find", binary), binary_text),
                           (("slurm", binary), binary_text), (("resume", tmp_path / "run"), "not a text (UTF-8)")):
        result = run_here(*args)
        assert result.returncode == 2 and expected in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout


# ---- the run directory -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_trains_into_one_run_dir_never_mix(shapes_dir, tmp_path):
    """Started together, many times (three pairs at once): in each pair one trains, the other is refused before
    writing anything, so the config, the checkpoints and the events all belong to the one that trained."""
    pairs = []
    for trial in range(3):
        procs = {}
        for lr in (0.011, 0.022):
            folder = tmp_path / f"{trial}-{lr}"
            folder.mkdir()
            cfg = write_config(folder, shapes_dir, optimizer={"lr": lr}, train={"epochs": 1 if lr == 0.011 else 2})
            procs[lr] = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir",
                                          str(tmp_path / f"run{trial}")], cwd=REPO, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
        pairs.append((tmp_path / f"run{trial}", procs))
    for run_dir, procs in pairs:
        results = {lr: (p.communicate(timeout=240)[1], p.returncode) for lr, p in procs.items()}
        winners = [lr for lr, (_, code) in results.items() if code == 0]
        assert len(winners) == 1, results
        loser = 0.022 if winners[0] == 0.011 else 0.011
        err, code = results[loser]
        assert code == 2 and ("in use by another run" in err or "already holds a run" in err), err
        assert "Traceback" not in err
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["optimizer"]["lr"] == winners[0]
        starts = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "run_start"]
        assert len(starts) == 1 and starts[0]["config"]["optimizer"]["lr"] == winners[0]
        assert RunDir(run_dir).read_status()["epoch"] == (1 if winners[0] == 0.011 else 2)


def test_training_into_a_finished_run_is_refused_unless_asked(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    assert run_here("train", cfg, "--run-dir", tmp_path / "run").returncode == 0
    before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    result = run_here("train", cfg, "--run-dir", tmp_path / "run", "--set", "optimizer.lr=0.3")
    assert result.returncode == 2 and "already holds a run (completed)" in result.stderr
    assert "main.py resume" in result.stderr and "--overwrite" in result.stderr
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["optimizer"]["lr"] == 0.05
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before
    result = run_here("train", cfg, "--run-dir", tmp_path / "run", "--overwrite", "--set", "train.epochs=2",
                      "checkpoint.keep_last=1")
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["best.pt", "ckpt-e0002-s00000012.pt", "last.pt"], "only the new run's checkpoints (keep_last 1)"
    starts = [e for e in read_events(tmp_path / "run" / "events.jsonl") if e["event"] == "run_start"]
    assert len(starts) == 1, "the old run's events were not kept mixed in"


@pytest.mark.slow
def test_a_run_directory_deleted_mid_run_is_named(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 20}, monitor={"log_every": 1})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir", str(run_dir)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_event(run_dir, lambda e: e["event"] == "step", proc=proc)
    events = read_events(run_dir / "events.jsonl")
    per_epoch = next(e for e in events if e["event"] == "run_start")["steps_per_epoch"]
    seen = max(e["step"] for e in events if e["event"] == "step")
    shutil.rmtree(run_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert f"the run directory {run_dir} was deleted" in err, err[-2000:]
    noticed = re.search(r"noticed at epoch (\d+), step (\d+)", err)
    assert noticed, "noticed at a log step, not when the end of the epoch failed to write: " + err[-2000:]
    epoch, step = map(int, noticed.groups())
    assert epoch == 1 and seen <= step < per_epoch, (seen, step, per_epoch)
    assert "Traceback" not in err


def test_a_full_disk_while_events_are_written_ends_the_run_as_failed(shapes_dir, tmp_path, monkeypatch):
    import errno

    from trainer.core.events import EventWriter

    real_emit = EventWriter.emit
    count = {"n": 0}

    def emit(self, event, **fields):
        count["n"] += 1
        if count["n"] > 12:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_emit(self, event, **fields)

    monkeypatch.setattr(EventWriter, "emit", emit)
    cfg = write_config(tmp_path, shapes_dir, monitor={"log_every": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    status = run.read_status()
    assert code == 1 and status["state"] == "failed" and status["exit_code"] == 1
    assert status["message"] == f"no space left on device in {run.path}"
    assert not list(run.path.glob(".*.tmp-*")), "no temporary files are left behind"


def test_a_full_disk_at_launch_gives_a_message(shapes_dir, tmp_path, monkeypatch, capsys):
    import errno
    from pathlib import Path

    cfg = write_config(tmp_path, shapes_dir)
    real_write = Path.write_bytes

    def full(self, *args, **kwargs):
        if ".tmp-" in self.name:
            real_write(self, b"")  # the 0-byte file a full disk leaves
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_bytes", full)  # what atomic_write_text writes its temporary file with
    code = cli.main(["train", str(cfg), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and "no space left on device in" in err and "Traceback" not in err
    assert not list((tmp_path / "run").glob(".*.tmp-*"))


# ---- the data --------------------------------------------------------------------------------------------

def test_symlink_loops_and_second_paths_count_each_image_once(tmp_path):
    from trainer.data.loader import stratified_split
    from trainer.data.scan import scan_image_folder

    root = tmp_path / "data"
    for cls in ("circle", "square"):
        (root / cls).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (8, 8), (i * 40, 0, 0) if cls == "circle" else (0, i * 40, 0)).save(root / cls / f"{i}.png")
    os.symlink(".", root / "circle" / "loop")  # circle/loop -> circle
    os.symlink(".", root / "all")  # a top-level link back to the dataset
    os.symlink(root / "circle", root / "square" / "also")  # the same pixels reached as another class
    result = scan_image_folder(root)
    assert result.classes == ["circle", "square"]
    assert len(result.samples) == 10 and result.counts == {"circle": 5, "square": 5}
    assert len({os.path.realpath(p) for p, _ in result.samples}) == 10
    text = " ".join(result.warnings)
    assert "links back to the dataset folder itself" in text and "scanned once" in text
    train, val = stratified_split(result.samples, 0.2, seed=0)
    assert not {os.path.realpath(p) for p, _ in train} & {os.path.realpath(p) for p, _ in val}


def test_an_exif_rotated_photo_is_learned_upright(tmp_path):
    from trainer.data.frame import Frame
    from trainer.data.loader import decode_image

    upright = Image.new("RGB", (40, 20), (255, 0, 0))
    upright.paste((0, 0, 255), (0, 0, 20, 20))  # blue on the left half when upright
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # how a camera held sideways stores it
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    stored.save(tmp_path / "phone.jpg", exif=exif, quality=95)
    pixels = decode_image(str(tmp_path / "phone.jpg"), Frame(20, 20)).float()
    left, right = pixels[:, :, :10].mean((1, 2)), pixels[:, :, 10:].mean((1, 2))
    assert left[2] > 200 and right[0] > 200, (left, right)


def test_a_class_without_validation_images_is_not_zero_accuracy(tmp_path):
    from trainer.data.demo_data import write_demo_dataset

    root = write_demo_dataset(tmp_path / "data", per_class=20, size=16, seed=2)
    lonely = root / "square"
    for extra in sorted(lonely.iterdir())[1:]:
        extra.unlink()  # one image: it goes to training, none to validation
    cfg = write_config(tmp_path, root, train={"epochs": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    events = read_events(run.events)
    epoch = next(e for e in events if e["event"] == "epoch")
    classes = next(e for e in events if e["event"] == "run_start")["classes"]
    assert epoch["per_class_acc"][classes.index("square")] is None
    warning = next(e for e in events if e["event"] == "warning" and e["kind"] == "no_val_images")
    assert "'square' has no validation images" in warning["message"]


def test_check_data_reports_images_outside_class_folders_and_odd_names(shapes_dir, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(shapes_dir, root)
    shutil.copy(next(shapes_dir.glob("circle/*.png")), root / "stray.png")
    shutil.copy(next(shapes_dir.glob("circle/*.png")), root / "circle" / "two\nlines.png")
    (root / "square" / "broken\nname.png").write_bytes(b"not a png")
    result = run_here("check-data", root)
    assert result.returncode == 0, result.stderr
    assert "1 images at the top level are outside any class folder" in result.stdout
    assert "hidden or non-image files ignored" not in result.stdout
    assert "'" + str(root / "square" / "broken\nname.png").replace("\n", "\\n") + "'" in result.stdout
    assert all(line.strip() for line in result.stdout.splitlines())
    missing = run_here("check-data", tmp_path / "nope")
    assert missing.returncode == 2 and "folder does not exist" in missing.stderr


# ---- stopping while preparing ----------------------------------------------------------------------------

def test_stop_during_the_cache_build_acts_at_once(shapes_dir, tmp_path, monkeypatch):
    """SIGTERM while images are decoded into the cache: the build is abandoned (no half entry), the run ends
    stopped, and it does so without decoding the rest of the folder."""
    import trainer.data.loader

    decoded = []
    real_decode = trainer.data.loader.decode_image

    def decode(path, size):
        decoded.append(path)
        if len(decoded) == 10:
            os.kill(os.getpid(), signal.SIGTERM)  # the user presses Stop
        time.sleep(0.01)
        return real_decode(path, size)

    monkeypatch.setattr(trainer.data.loader, "decode_image", decode)
    cache = tmp_path / "cache"
    cfg = write_config(tmp_path, shapes_dir, data={"cache": "disk", "cache_dir": str(cache), "image_size": 20})
    run, code = train_here(cfg, tmp_path / "runs")
    status = run.read_status()
    assert code == 0 and status["state"] == "stopped" and "while preparing" in status["message"]
    assert len(decoded) < 40, f"{len(decoded)} of 120 images decoded after the stop"
    assert not [p for p in cache.iterdir() if p.is_dir()], "no half-built cache entry is left"
    assert not [e for e in read_events(run.events) if e["event"] == "step"]

"""Input a user (or someone handing them files) gives that must not hurt: paths however they are written, YAML built to
explode, files that are not regular files, links that make one file two images, oversized cells and sweeps, and two
writers of one manifest (issue #45). Each answers in one line, in bounded time and memory."""

import os
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import digit_mosaics, run_here, write_config

from trainer.core.rundir import RunDir


@pytest.fixture(scope="module")
def mosaics(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml") / "ml"
    digit_mosaics(root, 60, seed=1)
    return root


def test_a_relative_folder_and_labels_file_check_as_the_absolute_ones(mosaics, tmp_path):
    """`check-data ml --labels ml/labels.csv` said every image "is not an image in the folder"."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(mosaics, work / "ml")
    relative = run_here("check-data", "ml/images", "--labels", "ml/labels.csv", cwd=work)
    absolute = run_here("check-data", work / "ml" / "images", "--labels", work / "ml" / "labels.csv")
    assert relative.returncode == absolute.returncode == 0, relative.stderr + relative.stdout
    assert "60 usable images" in relative.stdout and "not an image in the folder" not in relative.stdout + relative.stderr
    assert relative.stdout.replace(str(work) + "/", "") == absolute.stdout.replace(str(work) + "/", "")


def test_relative_run_and_runs_directories_keep_the_manifest_where_it_is(shapes_dir, tmp_path):
    """`train cfg --set data.exclude=/abs/m.yaml --runs-dir runs` looked for runs/X/runs/X/exclude.yaml and failed."""
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    manifest = tmp_path / "m.yaml"
    left_out = sorted((shapes_dir / "circle").glob("*.png"))[:3]
    manifest.write_text(yaml.safe_dump({"exclude": [str(p) for p in left_out]}))
    by_runs_dir = run_here("train", cfg, "--set", f"data.exclude={manifest}", "--runs-dir", "runs", cwd=tmp_path)
    assert by_runs_dir.returncode == 0, by_runs_dir.stderr[-2000:]
    by_run_dir = run_here("train", cfg, "--set", "data.exclude=m.yaml", "--run-dir", "rel/M1", cwd=tmp_path)
    assert by_run_dir.returncode == 0, by_run_dir.stderr[-2000:]
    runs = [RunDir(p) for p in (tmp_path / "runs").iterdir()] + [RunDir(tmp_path / "rel" / "M1")]
    for run in runs:
        assert run.read_status()["state"] == "completed"
        kept = yaml.safe_load(run.manifest.read_text())
        assert sorted(map(os.path.realpath, kept["exclude"])) == [os.path.realpath(p) for p in left_out]


def alias_bomb(levels: int = 7) -> str:
    """YAML of a few hundred bytes that stands for 9**levels strings ("billion laughs")."""
    text, last = '[&a0 ["x","x","x","x","x","x","x","x","x"]', "a0"
    for n in range(1, levels):
        text += f', &a{n} [' + ",".join([f"*{last}"] * 9) + "]"
        last = f"a{n}"
    return text + "]"


@pytest.mark.parametrize("how", ["set", "file", "advanced"])
def test_an_alias_bomb_is_one_short_line(shapes_dir, tmp_path, how):
    """It printed one error line of 254 MB (1.56 GB, 12.6 s); one level deeper, a MemoryError."""
    if how == "advanced":
        pytest.importorskip("PySide6")
        from app.pages.advanced_page import parse_value
        from trainer.core.config import RunConfig

        value = parse_value(alias_bomb(9))
        assert value == alias_bomb(9), "the typed text itself, which validation names, cut short"
        with pytest.raises(Exception) as refused:
            RunConfig.from_dict({"optimizer": {"groups": value}})
        assert len(str(refused.value)) < 1024
        return
    cfg = write_config(tmp_path, shapes_dir)
    if how == "set":
        result = run_here("train", cfg, "--set", f"optimizer.groups={alias_bomb(9)}", "--runs-dir", tmp_path / "runs")
    else:
        raw = yaml.safe_load(cfg.read_text())
        cfg.write_text(yaml.safe_dump(raw) + f"bomb: {alias_bomb(9)}\n")
        result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2 and "expands to more than" in result.stderr
    assert len(result.stderr) < 1024 and len(result.stderr.strip().splitlines()) == 1, result.stderr[:2000]
    assert not (tmp_path / "runs").exists()


def test_oversized_and_unparsable_yaml_are_one_line(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir)
    huge = tmp_path / "huge.yaml"
    huge.write_text("note: " + "x" * (5 << 20) + "\n")  # a 5 MB scalar: it printed all 5 MB after 15.6 s
    result = run_here("train", huge)
    assert result.returncode == 2 and "more than a YAML config file may be" in result.stderr and len(result.stderr) < 500
    result = run_here("train", cfg, "--set", "optimizer.groups=[{pattern: fc", "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--set optimizer.groups: invalid YAML at line 1" in result.stderr and "^" not in result.stderr


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_fifo_or_a_device_given_as_a_file_answers_at_once(mosaics, shapes_dir, tmp_path, fifo):
    """Each of these waited for ever on the FIFO; /dev/zero as a manifest read 6.6 GB."""
    from helpers import train_here

    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    cases = [(("check-data", mosaics / "images", "--labels", fifo), "is a FIFO"),
             (("train", cfg, "--set", f"data.labels={fifo}", "loss.name=bce", "--runs-dir", tmp_path / "r2"), "is a FIFO"),
             (("train", cfg, "--set", f"data.exclude={fifo}", "--runs-dir", tmp_path / "r3"), "is a FIFO"),
             (("train", fifo), "is a FIFO"),
             (("label", run.path, "--pool", shapes_dir, "--manifest", fifo), "is a FIFO"),
             (("label", run.path, "--pool", shapes_dir, "--manifest", "/dev/zero"), "is a device")]
    for args, said in cases:
        result = run_here(*args)
        assert result.returncode == 2 and said in result.stderr, (args, result.stderr[-1000:])
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def test_a_labels_file_names_its_unusable_images_and_refuses_links_and_giant_cells(mosaics, tmp_path):
    from faults.test_data_faults import png_header_only

    from trainer.data.labels import LabelsError, labelled_scan, read_labels

    root = tmp_path / "ml"
    shutil.copytree(mosaics, root)
    png_header_only(root / "images" / "bomb.png", 13000, 13000)  # 685 KB claiming 169 M pixels
    (root / "images" / "empty.png").write_bytes(b"")
    (root / "images" / "text.png").write_text("not an image")
    labels = root / "labels.csv"
    labels.write_text(labels.read_text() + "images/bomb.png,1\nimages/empty.png,2\nimages/text.png,3\n")
    report = run_here("check-data", root / "images", "--labels", labels)
    assert report.returncode == 0 and "60 usable images" in report.stdout and "3 files cannot be used" in report.stdout
    assert "bomb.png: too large to decode safely" in report.stdout and "empty.png: empty file" in report.stdout
    scan = labelled_scan(str(labels), "data.labels")
    assert len(scan.samples) == 60 and {os.path.basename(p) for p, _ in scan.bad_files} == {"bomb.png", "empty.png",
                                                                                             "text.png"}
    predicted = run_here("predict", tmp_path / "nowhere", root / "images" / "bomb.png")
    assert predicted.returncode == 2

    linked = root / "linked.csv"  # a link to a listed image, with other labels: one file is one image
    os.symlink(root / "images" / "00001.png", root / "images" / "alias.png")
    linked.write_text(labels.read_text() + "images/alias.png,7\n")
    with pytest.raises(LabelsError, match=r"line 65: 'images/alias.png' is a link to '00001.png', listed on line 3"):
        read_labels(linked)
    giant = root / "giant.csv"
    giant.write_text("file,labels\nimages/00000.png," + "a" * 140_000 + "\n")
    with pytest.raises(LabelsError, match=r"giant.csv: line 2: field larger than field limit"):
        read_labels(giant)


def _mark_many(path: str, prefix: str, count: int) -> None:
    from trainer.data.manifest import edit_manifest

    for n in range(count):
        edit_manifest(path, lambda m, n=n: m.mark_excluded(f"/data/{prefix}-{n}.png"))


@pytest.mark.slow
def test_two_writers_of_one_manifest_keep_every_entry(tmp_path):
    """Two processes each running the app's read -> mark -> write 200 times kept 204 of 400 entries."""
    import multiprocessing

    from trainer.data.manifest import read_manifest

    path = str(tmp_path / "m.exclude.yaml")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_mark_many, args=(path, name, 200)) for name in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
        assert w.exitcode == 0
    assert len(read_manifest(path).exclude) == 400


@pytest.mark.parametrize("trials", [10_000, 1_000_000_000])
def test_a_sweep_too_large_is_refused_at_once_and_queues_nothing(shapes_dir, tmp_path, trials):
    """trials: 10000 was silent for 120 s, then queued runs one by one; 1000000000 never answered."""
    cfg = write_config(tmp_path, shapes_dir)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(cfg), "random": {"optimizer.lr": {"low": 1e-3, "high": 1e-1}},
                                     "trials": trials}))
    result = run_here("sweep", sweep, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2 and f"{trials:,} trials" in result.stderr and "at most 1,000" in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_sweep_interrupted_while_queueing_leaves_nothing_queued(shapes_dir, tmp_path, monkeypatch):
    """All or nothing: an interrupt on the fifth run removes the four made; none was ever queued."""
    from trainer.runs import prepare, queue
    from trainer.runs.sweep import queue_sweep, read_sweep

    cfg = write_config(tmp_path, shapes_dir)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(cfg), "grid": {"optimizer.lr": [0.01, 0.02, 0.03, 0.04, 0.05]}}))
    real, made = prepare.prepare_run, []

    def interrupted_on_the_fifth(*args, **kwargs):
        if len(made) == 4:
            assert queue.queued(tmp_path / "runs") == [], "none is queued before all are"
            raise KeyboardInterrupt
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(prepare, "prepare_run", interrupted_on_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        queue_sweep(read_sweep(sweep), tmp_path / "runs")
    assert len(made) == 4 and not any(run.path.exists() for run, _ in made)
    monkeypatch.setattr(prepare, "prepare_run", real)
    runs = queue_sweep(read_sweep(sweep), tmp_path / "runs")
    assert [r.read_status()["queue"]["position"] for r in runs] == [1, 2, 3, 4, 5]


def test_a_link_in_test_to_a_training_image_is_a_leak_and_a_pool_of_training_images_is_set_aside(shapes_dir,
                                                                                                     tmp_path):
    from helpers import train_here

    root = tmp_path / "split"
    shutil.copytree(shapes_dir, root / "train")
    (root / "test" / "circle").mkdir(parents=True)
    for cls in ("square", "cross", "triangle"):
        (root / "test" / cls).mkdir()
        shutil.copy(next((root / "train" / cls).glob("*.png")), root / "test" / cls / "own.png")
    leaked = sorted((root / "train" / "circle").glob("*.png"))[0]
    os.symlink(leaked, root / "test" / "circle" / "leak.png")  # the same file, reached from test/
    report = run_here("check-data", root)
    assert report.returncode == 0 and "leak.png" in report.stdout, report.stdout[-2000:]

    cfg = write_config(tmp_path, root / "train", train={"epochs": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    labelled = run_here("label", run.path, "--pool", root / "train", "--next", "5")
    assert labelled.returncode == 0, labelled.stderr[-1000:]
    assert "label next: 0 of the 120 pool images" in labelled.stdout, labelled.stdout[:500]
    assert "120 pool image(s) already in the run's data" in labelled.stdout, "set aside and named, not offered"


def test_an_export_needs_room_cleans_up_after_a_killed_one_and_leaves_a_user_s_card_files(tmp_path, monkeypatch):
    import shutil as shutil_module

    import torch

    from trainer.deploy import export
    from trainer.deploy.model_card import out_problem

    out = tmp_path / "m.pt2"
    dead = tmp_path / f"{export.work_prefix(out)}999999999-abcd"  # an export killed with kill -9
    alive = tmp_path / f"{export.work_prefix(out)}{os.getpid()}-efgh"  # one going on now
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "m.pt2").write_bytes(b"partial")
    export.remove_stale_work(out)
    assert not dead.exists() and alive.exists()

    net = torch.nn.Linear(1000, 1000)  # 4 MB of weights
    usage = shutil_module.disk_usage(tmp_path)
    monkeypatch.setattr(export.shutil, "disk_usage", lambda p: usage._replace(free=300_000))
    with pytest.raises(export.ExportError, match=rf"no space left on device in {tmp_path}: the export needs about 5.1 MB"):
        export.check_room(net, tmp_path)

    mine = tmp_path / "model.onnx"
    Path(f"{mine}.md").write_text("my notes")  # the user's, with no export beside it
    assert "model.onnx.md exists (where the model card would go) with no export beside it" in out_problem("onnx", mine)


def test_check_data_counts_the_manifest_s_additions_and_escapes_control_characters(shapes_dir, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(shapes_dir, root)
    extra = tmp_path / "elsewhere" / "new.png"
    extra.parent.mkdir()
    shutil.copy(next((root / "circle").glob("*.png")), extra)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"add": {str(extra): "circle"}}))
    (root / "square" / "bad\x1b[31mname.png").write_bytes(b"")  # an escape sequence in a file name
    report = run_here("check-data", root, "--exclude", manifest)
    assert report.returncode == 0, report.stderr
    assert "4 classes, 121 usable images" in report.stdout, "120 from the folder and the manifest's addition"
    assert "\x1b" not in report.stdout and "\\x1b[31m" in report.stdout


@pytest.mark.parametrize("columns", [10**5, 10**6])
def test_a_labels_file_of_a_million_columns_is_one_line_at_once(mosaics, tmp_path, columns):
    """Issue #67: 10^5 or 10^6 one-hot columns (0.7-9.9 MB) hung check-data and train (a label looked up in a list
    per column: quadratic). More columns than a labels file has is one line, read once."""
    import time

    labels = tmp_path / "labels.csv"
    labels.write_text("file," + ",".join(f"l{i}" for i in range(columns)) + "\nimages/a.png," +
                      ",".join("0" for _ in range(columns)) + "\n")
    started = time.monotonic()
    result = run_here("check-data", mosaics / "images", "--labels", labels)
    assert result.returncode == 2 and f"{columns:,} label columns; a labels file has at most 50,000" in result.stderr
    assert time.monotonic() - started < 10, "answered at once"


def test_twenty_thousand_labels_on_two_images_count_their_pairs_within_bounds(mosaics, tmp_path):
    """20,000 labels on each of two images: 2 x 10^8 label pairs (3.9 GB) before; pairs are counted among the most
    frequent labels, so the report comes at once and names the most frequent pairs still."""
    import resource
    import time

    from trainer.data.labels import read_labels

    labels = tmp_path / "labels.csv"
    header = ",".join(f"label{i}" for i in range(20_000))
    every, some = ",".join("1" for _ in range(20_000)), ",".join("1" if i == 7 else "0" for i in range(20_000))
    labels.write_text(f"file,{header},extra\nimages/a.png,{every},0\nimages/b.png,{every},1\nimages/c.png,{some},1\n")
    started, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pairs = read_labels(labels).co_occurrence()
    assert time.monotonic() - started < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 500 * 1024, "under 500 MB more (kB)"
    assert pairs.most_common(1)[0][1] == 2 and len(pairs) == 64 * 63 // 2, "the most frequent pairs, counted"
    assert pairs[("label7", "label8")] == 2 and ("label7", "extra") not in pairs or pairs[("label7", "extra")] == 2


def test_a_nul_or_an_escape_from_a_labels_file_never_reaches_the_terminal(mosaics, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_bytes(b"file,labels\nimages/x\x00y\x1b[31m.png,a\n")
    result = run_here("check-data", mosaics / "images", "--labels", labels)
    assert result.returncode == 2 and "x\\x00y\\x1b[31m.png" in result.stderr, result.stderr
    assert "\x00" not in result.stderr and "\x1b" not in result.stderr


def test_a_run_folder_name_too_long_is_one_line_and_leaves_no_folder(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir)
    result = run_here("train", cfg, "--run-dir", tmp_path / "runs" / ("r" * 300))
    assert result.returncode == 2 and "--run-dir: a folder name of 300 bytes" in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists(), "no empty folder left behind"

"""What the user sees when a host cannot be used: one line naming the host and what to do, exit 2, no hang, and no
run directory left behind here or there."""

from __future__ import annotations

import json

import pytest
from helpers import run_here, write_config


def test_an_unknown_host_is_named_with_the_hosts_file(hosts, shapes_dir, tmp_path):
    done = run_here("train", write_config(tmp_path, shapes_dir), "--host", "nowhere")
    assert done.returncode == 2
    assert "--host nowhere: no such host" in done.stderr and str(hosts["file"]) in done.stderr
    assert "known: cluster, down, loop, nocommand, nokey" in done.stderr


def test_an_unreachable_host_and_a_refused_key_fail_fast_with_what_to_do(hosts):
    done = run_here("probe-devices", "--host", "down")
    assert done.returncode == 2 and "down: cannot reach 127.0.0.1" in done.stderr
    assert "Connection refused" in done.stderr
    done = run_here("hosts", "check", "nokey")
    assert done.returncode == 2
    assert "nokey: loop-nokey refused the login" in done.stderr and "ssh-copy-id loop-nokey" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_host_without_traindeck_or_with_another_version_says_what_to_install(hosts, tmp_path, monkeypatch):
    done = run_here("hosts", "check", "nocommand")
    assert done.returncode == 2
    assert "nocommand: the TrainDeck command `/opt/nowhere/bin/python /opt/nowhere/main.py` does not run" in done.stderr
    assert "install TrainDeck there" in done.stderr

    fake = tmp_path / "old_traindeck.py"
    fake.write_text('import json\nprint(json.dumps({"traindeck": "0.0.1", "events": 0, "protocol": 1}))\n')
    import sys

    import yaml

    entries = dict(hosts["entries"], old=dict(hosts["entries"]["loop"], command=f"{sys.executable} {fake}"))
    hosts["file"].write_text(yaml.safe_dump({"hosts": entries}))
    done = run_here("hosts", "check", "old")
    assert done.returncode == 2
    assert "TrainDeck 0.0.1 there speaks event schema 0" in done.stderr and "install TrainDeck 0.1.0" in done.stderr


@pytest.mark.slow
def test_a_missing_dataset_on_the_host_is_refused_by_the_trainer_there(hosts, tmp_path):
    config = write_config(tmp_path, tmp_path / "not-on-the-host")
    done = run_here("train", config, "--host", "loop", "--runs-dir", hosts["local_runs"])
    assert done.returncode == 2
    assert "loop: data.train_dir" in done.stderr and "not-on-the-host" in done.stderr
    assert not (hosts["local_runs"] / "remote").exists()  # no mirror
    remote = hosts["remote_runs"]
    assert [p.name for p in remote.iterdir()] == [".pending"] and not any((remote / ".pending").iterdir())


def test_the_remote_folder_browser_and_scan_read_the_host(hosts, shapes_dir):
    done = run_here("agent", "ls", shapes_dir, "--host", "loop")  # what the app's folder browser runs, over ssh
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert [(e["name"], e["images"]) for e in listing["entries"]] == [
        ("circle", 30), ("cross", 30), ("square", 30), ("triangle", 30)]
    done = run_here("check-data", "--host", "loop", shapes_dir)
    assert done.returncode == 0, done.stderr
    assert "4 classes" in done.stdout and "120" in done.stdout

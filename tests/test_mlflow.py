"""`monitor.mlflow` (issue #48): a run logged to a real MLflow tracking server (`mlflow server` on 127.0.0.1, a SQLite
store and an artefact folder, started here) and read back through MLflow's own client; the refusals before a run
directory exists; a server gone costs the run nothing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import run_here, write_config

from trainer.core.events import read_events
from trainer.core.rundir import RunDir

pytest.importorskip("mlflow", reason="pip install -e '.[mlflow]' (the .[dev] set-up installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A tracking server of MLflow's own on a free port, its store and artefacts in a temporary folder."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    server = subprocess.Popen([mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                               "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                               "--artifacts-destination", str(root / "artifacts")],
                              stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            break
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                os.killpg(server.pid, signal.SIGKILL)
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield url
    os.killpg(server.pid, signal.SIGKILL)  # its store is thrown away with the folder: no need to wait for it
    server.wait(20)


@pytest.mark.slow  # a tracking server started (~20 s) and a real run with its test set and ONNX export
def test_a_run_s_params_metrics_and_files_read_back_from_a_real_tracking_server(mlflow_server, tmp_path, shapes_dir):
    from mlflow.tracking import MlflowClient

    cfg = write_config(tmp_path, shapes_dir, data={"test_split": 0.2},
                       monitor={"log_every": 2, "mlflow": mlflow_server, "mlflow_experiment": "shapes"},
                       export={"formats": ["onnx"]})
    done = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    kept = json.loads((run / "mlflow.json").read_text())
    assert kept["tracking_uri"] == mlflow_server and kept["experiment"] == "shapes"
    client = MlflowClient(tracking_uri=mlflow_server)
    logged = client.get_run(kept["run_id"])
    assert logged.info.status == "FINISHED" and logged.info.run_name == run.name
    assert client.get_experiment(logged.info.experiment_id).name == "shapes"
    page = RunDir(run).mlflow_page()  # the Runs page's MLflow button: the run's page in the server's UI
    assert page == f"{mlflow_server}/#/experiments/{logged.info.experiment_id}/runs/{kept['run_id']}"
    assert b"<html" in urllib.request.urlopen(page.split("#")[0], timeout=10).read(2000).lower()
    params = logged.data.params
    assert params["model.name"] == "small_cnn" and params["train.epochs"] == "2" and params["data.test_split"] == "0.2"
    assert params["optimizer.lr"] == "0.05", "the config as the run read it, every key"

    events = read_events(run / "events.jsonl")
    epochs = [e for e in events if e["event"] == "epoch"]
    history = client.get_metric_history(kept["run_id"], "val_acc")
    assert [(m.step, m.value) for m in history] == [(e["step"], pytest.approx(e["val_acc"])) for e in epochs]
    steps = [e for e in events if e["event"] == "step"]
    losses = client.get_metric_history(kept["run_id"], "loss")
    assert len(losses) == len(steps) >= 2 and losses[-1].value == pytest.approx(steps[-1]["loss"])
    (test,) = [e for e in events if e["event"] == "test"]
    assert logged.data.metrics["test_accuracy"] == pytest.approx(test["accuracy"])

    def listed(path=None):
        return {f.path for f in client.list_artifacts(kept["run_id"], path)}

    assert "confusion_matrix.png" in listed() and {"eval/val", "eval/test", "exports"} <= listed() | listed("eval")
    assert {"eval/val/metrics.json", "eval/test/metrics.json"} <= listed("eval/val") | listed("eval/test")
    assert {"exports/model.onnx", "exports/model.onnx.json", "exports/model.onnx.md"} <= listed("exports")
    fetched = client.download_artifacts(kept["run_id"], "exports/model.onnx", str(tmp_path / "fetched"))
    assert hashlib.sha256(Path(fetched).read_bytes()).digest() == \
        hashlib.sha256((run / "exports" / "model.onnx").read_bytes()).digest()
    png = client.download_artifacts(kept["run_id"], "confusion_matrix.png", str(tmp_path / "fetched"))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    more = run_here("resume", run, "--epochs", "3")  # continued: the same MLflow run goes on
    assert more.returncode == 0, more.stderr[-3000:]
    assert json.loads((run / "mlflow.json").read_text())["run_id"] == kept["run_id"]
    epochs = [e for e in read_events(run / "events.jsonl") if e["event"] == "epoch"]
    history = client.get_metric_history(kept["run_id"], "val_acc")
    assert [(m.step, m.value) for m in history] == [(e["step"], pytest.approx(e["val_acc"])) for e in epochs]
    assert len(history) == 3 and client.get_run(kept["run_id"]).info.status == "FINISHED"
    assert len(client.search_runs([logged.info.experiment_id])) == 1, "no second MLflow run for the same run"

    # a copy of the run under another name, its mlflow.json naming the first one's MLflow run: resumed, it logs to a
    # record of its own and the first one's is untouched (issue #67)
    other = shutil.copytree(run, tmp_path / "others" / f"{run.name}-copy")
    assert run_here("resume", other, "--epochs", "4").returncode == 0
    assert len(client.get_metric_history(kept["run_id"], "val_acc")) == 3, "the first run's record untouched"
    assert client.get_run(kept["run_id"]).info.status == "FINISHED"
    own = json.loads((other / "mlflow.json").read_text())["run_id"]
    assert own != kept["run_id"] and client.get_run(own).info.run_name == other.name


def test_a_bad_or_unanswered_tracking_uri_is_refused_before_a_run_directory_exists(tmp_path, shapes_dir):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for value, said in ((closed, f"no MLflow tracking server answers at {closed}"),
                        ("mlflow-server", "must be a tracking URI"), ("gopher://example.org", "must be a tracking URI"),
                        ("javascript:alert(1)", "must be a tracking URI"),
                        (f"file://{tmp_path}/mlruns", "MLflow's own file store no longer takes new runs"),
                        ({"mlflow": closed, "mlflow_experiment": "x" * 100_000}, "at most 500 characters")):
        monitor = value if isinstance(value, dict) else {"mlflow": value}
        cfg = write_config(tmp_path, shapes_dir, monitor=monitor)
        done = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
        assert done.returncode == 2 and "monitor.mlflow" in done.stderr and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()


def test_a_tracking_server_gone_costs_the_run_nothing_but_a_line_in_its_log(tmp_path, caplog):
    """The sink sends on a thread of its own (the events go into a queue); the first failure is one warning in the
    run's log, nothing more is sent, and the run's end is not held up."""
    from trainer.train.mlflow_sink import MLflowSink

    sink = MLflowSink(tmp_path, f"http://127.0.0.1:{free_port()}", "gone")
    with caplog.at_level(logging.WARNING, logger="trainer"):
        sink({"event": "run_start", "time": time.time(), "config": {"model": {"name": "small_cnn"}}})
        for step in range(1, 200):
            sink({"event": "step", "time": time.time(), "step": step, "loss": 1.0 / step, "lr": [0.1]})
        sink({"event": "run_end", "time": time.time(), "status": "completed", "step": 199})
        sink.close()
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mlflow:")]
    assert len(warnings) == 1 and "cannot log to http://127.0.0.1" in warnings[0] and "goes on without it" in \
        warnings[0], warnings
    assert not (tmp_path / "mlflow.json").exists() and sink.thread is None

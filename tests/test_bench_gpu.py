"""bench/gpu.sh, the GPU benchmark, run on the CPU with a tiny dataset: every step of it works where no GPU is."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO


@pytest.mark.slow
def test_the_gpu_benchmark_runs_on_the_cpu(tmp_path):
    results = tmp_path / "gpu.json"
    out = subprocess.run([str(REPO / "bench" / "gpu.sh"), "--smoke", "--results", str(results)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHON=sys.executable))
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(results.read_text())
    assert data["smoke"] and data["model"] == "resnet18"  # the smoke run: the steps on a small model
    assert set(data["rows"]) == {"plain loop (torchvision reference style)",
                                 "trainer, host cache, pinned copies one batch ahead",
                                 "trainer, no cache (DataLoader workers decode)"}
    assert "trainer, GPU-resident cache: needs a GPU" in out.stdout, "the variant a CPU cannot run is said, not faked"
    assert all(rate > 0 for rate in data["rows"].values())
    for label in data["rows"]:
        assert f"| {label} |" in out.stdout, "the table names every variant"

"""Fixtures (imported by tests/conftest.py) with real servers for the remote tests: an OpenSSH sshd on 127.0.0.1
with keys made here (tests/servers/loopback_sshd.py) and a one-node SLURM (tests/servers/start_slurm.sh).
The "remote" TrainDeck is this checkout, its runs folder another directory.

Each is skipped, with the reason, only when it cannot be started (no sshd or slurm installed, not root)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers.loopback_sshd import SSHD, free_port, start_loopback_sshd, stop_loopback_sshd

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """{"config": an ssh_config with Host `loop` (and `loop-nokey`, a key the server does not know), "dir": ...}."""
    if not os.path.exists(SSHD) or not shutil.which("ssh"):
        pytest.skip("openssh-server is not installed (apt-get install openssh-server)")
    try:
        server = start_loopback_sshd(tmp_path_factory.mktemp("sshd"))
    except RuntimeError as e:
        pytest.skip(str(e))
    yield server
    stop_loopback_sshd(server)


@pytest.fixture
def slurm(slurm_started):
    """The one-node test cluster, this test's alone: a test of the suite's other worker that uses it waits (a job that
    fills the node would make the other test's job pend, which it would read as its own)."""
    import fcntl

    with open(TEST_SLURM_CONF.parent / "tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield slurm_started


@pytest.fixture(scope="session")
def slurm_started():
    if os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"):
        pytest.skip("SLURM is not installed or this is not root (apt-get install slurm-wlm munge; run as root)")
    try:
        done = subprocess.run(["bash", str(REPO / "tests" / "servers" / "start_slurm.sh")], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip("SLURM did not start within 120 s (tests/servers/start_slurm.sh)")
    if done.returncode != 0:
        pytest.skip(f"SLURM did not start: {done.stderr.strip()[-300:]}")
    os.environ["SLURM_CONF"] = str(TEST_SLURM_CONF)  # this process's squeue/sinfo; the cluster host's command sets it
    return True


REMOTE_COMMAND = f"{sys.executable} {REPO / 'main.py'}"
# the test cluster's own configuration (tests/servers/start_slurm.sh): never the machine's /etc/slurm
TEST_SLURM_CONF = Path(os.environ.get("TRAINDECK_TEST_SLURM", "/tmp/traindeck-test-slurm")) / "slurm.conf"


@pytest.fixture
def hosts(sshd, tmp_path, monkeypatch):
    """A hosts.yaml with `loop` (SSH), `cluster` (SLURM through the same login) and broken ones; the remote runs
    folder. TRAINDECK_HOSTS is set for this process and its children."""
    import yaml

    remote_runs = tmp_path / "remote-runs"
    options = ["-F", str(sshd["config"])]
    # a test's simulated device (the `simulated` fixture, asked for before this one) goes to the host's commands too
    simulated = os.environ.get("TRAINDECK_SIMULATED_DEVICE")
    remote_command = (f"env TRAINDECK_SIMULATED_DEVICE={shlex.quote(simulated)} {REMOTE_COMMAND}" if simulated
                      else REMOTE_COMMAND)
    entries = {
        "loop": {"ssh": "loop", "command": remote_command, "runs": str(remote_runs), "ssh_options": options},
        "cluster": {"ssh": "loop", "command": f"env SLURM_CONF={TEST_SLURM_CONF} {remote_command}",
                    "runs": str(remote_runs), "scheduler": "slurm",
                    "ssh_options": options},
        "nokey": {"ssh": "loop-nokey", "command": REMOTE_COMMAND, "runs": str(remote_runs), "ssh_options": options},
        "down": {"ssh": "127.0.0.1", "command": REMOTE_COMMAND, "runs": str(remote_runs),
                 "ssh_options": ["-p", str(free_port()), "-o", "StrictHostKeyChecking=no",
                                 "-o", "UserKnownHostsFile=/dev/null"]},
        "nocommand": {"ssh": "loop", "command": "/opt/nowhere/bin/python /opt/nowhere/main.py",
                      "runs": str(remote_runs), "ssh_options": options},
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": entries}))
    monkeypatch.setenv("TRAINDECK_HOSTS", str(path))
    from trainer.remote import ssh
    from trainer.remote.hosts import load_hosts

    ssh._checked_hosts.clear()
    yield {"file": path, "remote_runs": remote_runs, "local_runs": tmp_path / "runs", "entries": entries}
    try:
        hosts_now = load_hosts()  # as the test left the file (it may have added hosts, or broken it on purpose)
    except Exception:  # noqa: BLE001 - a broken file opened no connection
        hosts_now = {}
    for host in hosts_now.values():  # the master connections this test's hosts opened (ControlPersist 600 s)
        ssh.disconnect(host)

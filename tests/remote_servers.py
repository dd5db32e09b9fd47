"""Fixtures (imported by tests/conftest.py) with real servers for the remote tests: an OpenSSH sshd on 127.0.0.1 with a key made here, and a one-node SLURM
(tests/servers/start_slurm.sh). The "remote" TrainDeck is this checkout, its runs folder another directory.

Each is skipped, with the reason, only when it cannot be started (no sshd or slurm installed, not root)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """{"config": an ssh_config with Host `loop` (and `loop-nokey`, a key the server does not know), "dir": ...}."""
    if not os.path.exists(SSHD) or not shutil.which("ssh"):
        pytest.skip("openssh-server is not installed (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key", "other_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile {d}/sshd.pid
MaxSessions 50
MaxStartups 50
""")
    Path("/run/sshd").mkdir(exist_ok=True)
    started = subprocess.run([SSHD, "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")], capture_output=True,
                             text=True)  # daemonises: the server and its sessions are not this process's children
    if started.returncode != 0:
        pytest.skip(f"sshd did not start: {started.stderr.strip()}")
    common = f"""  HostName 127.0.0.1
  Port {port}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
"""
    (d / "ssh_config").write_text(f"Host loop\n{common}  IdentityFile {d}/user_key\n"
                                  f"Host loop-nokey\n{common}  IdentityFile {d}/other_key\n")
    for _ in range(50):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield {"config": d / "ssh_config", "dir": d, "port": port}
    try:
        os.kill(int((d / "sshd.pid").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="session")
def slurm():
    if os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"):
        pytest.skip("SLURM is not installed or this is not root (apt-get install slurm-wlm munge; run as root)")
    done = subprocess.run(["bash", str(REPO / "tests" / "servers" / "start_slurm.sh")], capture_output=True, text=True,
                          timeout=180)
    if done.returncode != 0:
        pytest.skip(f"SLURM did not start: {done.stderr.strip()[-300:]}")
    return True


REMOTE_COMMAND = f"{sys.executable} {REPO / 'main.py'}"


@pytest.fixture
def hosts(sshd, tmp_path, monkeypatch):
    """A hosts.yaml with `loop` (SSH), `cluster` (SLURM through the same login) and broken ones; the remote runs
    folder. TRAINDECK_HOSTS is set for this process and its children."""
    import yaml

    remote_runs = tmp_path / "remote-runs"
    options = ["-F", str(sshd["config"])]
    entries = {
        "loop": {"ssh": "loop", "command": REMOTE_COMMAND, "runs": str(remote_runs), "ssh_options": options},
        "cluster": {"ssh": "loop", "command": REMOTE_COMMAND, "runs": str(remote_runs), "scheduler": "slurm",
                    "ssh_options": options},
        "nokey": {"ssh": "loop-nokey", "command": REMOTE_COMMAND, "runs": str(remote_runs), "ssh_options": options},
        "down": {"ssh": "127.0.0.1", "command": REMOTE_COMMAND, "runs": str(remote_runs),
                 "ssh_options": ["-p", str(_free_port()), "-o", "StrictHostKeyChecking=no",
                                 "-o", "UserKnownHostsFile=/dev/null"]},
        "nocommand": {"ssh": "loop", "command": "/opt/nowhere/bin/python /opt/nowhere/main.py",
                      "runs": str(remote_runs), "ssh_options": options},
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": entries}))
    monkeypatch.setenv("TRAINDECK_HOSTS", str(path))
    from trainer import ssh

    ssh._checked_hosts.clear()
    return {"file": path, "remote_runs": remote_runs, "local_runs": tmp_path / "runs", "entries": entries}

"""An OpenSSH server on 127.0.0.1 with keys made for it: the "remote host" of the remote tests and bench/remote.py.

It daemonises (its sessions are not the caller's children). Host `loop` logs in with the key it knows,
`loop-nokey` with one it does not.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_loopback_sshd(folder: Path) -> dict:
    """{"config": its ssh_config, "dir": folder, "port": ...}; RuntimeError when sshd cannot be started."""
    if not os.path.exists(SSHD) or not shutil.which("ssh"):
        raise RuntimeError("openssh-server is not installed (apt-get install openssh-server)")
    d = Path(folder)
    for key in ("host_key", "user_key", "other_key"):
        if not (d / key).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    port = free_port()
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
                             text=True)
    if started.returncode != 0:
        raise RuntimeError(f"sshd did not start: {started.stderr.strip()}")
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
    return {"config": d / "ssh_config", "dir": d, "port": port}


def stop_loopback_sshd(server: dict) -> None:
    try:
        os.kill(int((server["dir"] / "sshd.pid").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass

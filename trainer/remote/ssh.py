"""Reaching a host: TrainDeck commands run there through the system `ssh`, one shared connection per host.

Torch-free. Everything the user set up for OpenSSH (~/.ssh/config aliases, keys, the agent, ProxyJump) works,
because this is their own client. It never asks for a password (`BatchMode`): a host that needs one is refused
with what to do. A master connection per host (`ControlMaster`, its socket under ~/.cache/traindeck/ssh) makes
each later command a round trip instead of a new login; it is started on its own (`-fN`) so no caller's pipe is
held open by it.

`remote_main(host, args)` runs `HOST.command ARGS` there; `check(host)` is the version handshake.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from trainer.core.system import user_dir
from trainer.remote.hosts import Host, HostError
from trainer.remote.protocol import MAX_ANSWER_BYTES, PROTOCOL, FrameError, parse_answer
from trainer.runs.commands import Agent

STDERR_KEPT = 64 << 10  # the end of a remote command's error output (its last line is what is said)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10
PERSIST_S = 600
SSH_FAILED = 255  # ssh's own exit code: it could not connect (the remote command's codes are passed through)
NOT_FOUND = 127  # the shell there could not find the command


def control_dir() -> Path:
    path = user_dir("cache") / "ssh"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def control_path(host: Host) -> Path:
    """The master connection's socket: one per host entry (ssh's own %C would share one between two aliases of one
    machine that log in with different keys)."""
    key = hashlib.sha1(json.dumps([host.ssh, host.ssh_options]).encode()).hexdigest()[:16]
    return control_dir() / key


def ssh_argv(host: Host, *options: str) -> list[str]:
    """`ssh` with TrainDeck's options for `host`, up to (not including) the remote command."""
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", f"ControlPath={control_path(host)}", *options, *host.ssh_options, "--", host.ssh]


def remote_line(host: Host, args: list[str]) -> str:
    """The shell command line run there: the host's TrainDeck command (as the user wrote it, so `~` and
    variables expand there) and the arguments, quoted."""
    return f"{host.command} {shlex.join(map(str, args))}"


def describe_ssh_failure(host: Host, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    said = lines[-1] if lines else "ssh exited with code 255"
    if "Permission denied" in said or "publickey" in said:
        return (f"{host.name}: {host.ssh} refused the login ({said}); TrainDeck logs in without a password "
                f"(BatchMode): add your key with `ssh-copy-id {host.ssh}` or load it with `ssh-add`")
    if "Host key verification failed" in said or "REMOTE HOST IDENTIFICATION" in stderr:
        return (f"{host.name}: the host key of {host.ssh} is not known or has changed; connect once with "
                f"`ssh {host.ssh}` in a terminal to check and accept it")
    return f"{host.name}: cannot reach {host.ssh}: {said}"


def connect(host: Host) -> None:
    """Make sure the host's master connection is up (start it when not); HostError when it cannot be."""
    if subprocess.run(ssh_argv(host, "-O", "check"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode == 0:
        return
    with tempfile.TemporaryFile() as err:  # not a pipe: the master lives on and would hold a pipe open
        code = subprocess.run(ssh_argv(host, "-o", "ControlMaster=yes", "-o", f"ControlPersist={PERSIST_S}", "-fN"),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err).returncode
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if code != 0:
        raise HostError(describe_ssh_failure(host, stderr))


def disconnect(host: Host) -> None:
    """Close the host's master connection (its sessions drop)."""
    subprocess.run(ssh_argv(host, "-O", "exit"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def command_argv(host: Host, args: list[str]) -> list[str]:
    """The local argv that runs `main.py ARGS` on the host (through the master connection when it is up)."""
    return ssh_argv(host, "-o", "ControlMaster=no") + [remote_line(host, args)]


def remote_main(host: Host, args: list[str], input: str | bytes | None = None, timeout: float | None = 120,
                check: bool = True) -> subprocess.CompletedProcess:
    """Run `main.py ARGS` on the host and wait; its output (bytes). HostError when ssh cannot connect or TrainDeck
    is not there; with `check`, the command's own `error:` line when it exits non-zero."""
    connect(host)
    data = input.encode() if isinstance(input, str) else input
    # The answer goes to files, not memory, and is read back bounded: a broken host cannot use up this machine's.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(command_argv(host, args), input=data, stdout=out, stderr=err, timeout=timeout,
                                  stdin=None if data is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostError(f"{host.name}: `{remote_line(host, args)}` gave no answer in {timeout:.0f} s") from None
        out.seek(0)
        done.stdout = out.read(MAX_ANSWER_BYTES + 1)
        err.seek(max(0, err.seek(0, os.SEEK_END) - STDERR_KEPT))
        done.stderr = err.read()
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode == SSH_FAILED:
        raise HostError(describe_ssh_failure(host, stderr))
    if done.returncode == NOT_FOUND or ("No such file or directory" in stderr and "main.py" in stderr):
        raise HostError(f"{host.name}: the TrainDeck command `{host.command}` does not run on {host.ssh} "
                        f"({last_line(stderr) or 'command not found'}); install TrainDeck there (docs/remote.md) or "
                        f"fix the host's command with `main.py hosts add {host.name} --command ...`")
    if check and done.returncode != 0:
        raise HostError(f"{host.name}: {last_line(stderr).removeprefix('error: ') or f'exit code {done.returncode}'}")
    return done


def remote_json(host: Host, args: list[str], input: str | None = None, timeout: float | None = 120):
    done = remote_main(host, args, input=input, timeout=timeout)
    return parse_answer(done.stdout, f"{host.name}: `{shlex.join(args)}`")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


_checked_hosts: dict[tuple, dict] = {}


def _handshake(host: Host) -> dict:
    from trainer import __version__
    from trainer.core.events import SCHEMA_VERSION

    done = remote_main(host, Agent(action="version").argv(), check=False, timeout=60)
    if done.returncode != 0:
        said = last_line(done.stderr.decode("utf-8", "replace"))
        raise HostError(f"{host.name}: the TrainDeck there is too old to be driven from this app ({said}); "
                        f"upgrade it to {__version__} (git pull && .venv/bin/pip install -e . in its folder)")
    theirs = parse_answer(done.stdout, f"{host.name}: `agent version`")
    if not isinstance(theirs, dict):
        raise FrameError(f"{host.name}: `agent version`: an answer that is not an object")
    if theirs.get("events") != SCHEMA_VERSION or theirs.get("protocol") != PROTOCOL:
        raise HostError(f"{host.name}: TrainDeck {theirs.get('traindeck')} there speaks event schema "
                        f"{theirs.get('events')} / protocol {theirs.get('protocol')}, this app {SCHEMA_VERSION} / "
                        f"{PROTOCOL}; install TrainDeck {__version__} on {host.ssh}")
    if theirs.get("traindeck") != __version__:
        log.warning("%s runs TrainDeck %s, this app %s (compatible: same event schema and protocol)",
                    host.name, theirs.get("traindeck"), __version__)
    return theirs




def check(host: Host) -> dict:
    """The version handshake (once per host and process): what the host runs; HostError when it cannot be
    driven (unreachable, no TrainDeck, another event schema or protocol) saying what to install."""
    key = (host.ssh, host.command, tuple(host.ssh_options))
    if key not in _checked_hosts:
        _checked_hosts[key] = _handshake(host)
    return _checked_hosts[key]

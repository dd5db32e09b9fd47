"""Hosts: the machines TrainDeck trains on besides this one, as the user's own OpenSSH client reaches them.

Torch-free. Kept in one YAML file (`$TRAINDECK_HOSTS`, else ~/.config/traindeck/hosts.yaml):

    hosts:
      lab:                                    # the name the app and `--host` use
        ssh: me@lab.example.org               # anything `ssh` accepts: an alias of ~/.ssh/config, user@host
        command: ~/traindeck/.venv/bin/python ~/traindeck/main.py   # TrainDeck there (a shell command line)
        runs: ~/traindeck-runs                # the runs folder there
        scheduler: ssh                        # ssh: run on that machine; slurm: it is a login node, sbatch there
        partition: gpu                        # slurm: the partition to submit to (default: the cluster's)
        ssh_options: [-p, "2222"]             # more ssh arguments (optional)

`main.py hosts add/list/remove/check` edits and checks it; docs/remote.md says how to set a host up.
"""

from __future__ import annotations

import os
import re
import reprlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from trainer.core.errors import InputError
from trainer.core.files import atomic_write_text
from trainer.core.system import user_dir

SCHEDULERS = ("ssh", "slurm")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
MAX_HOSTS_FILE = 1 << 20  # bytes: a hosts file is a few lines; a larger one is not read
SHOWN = 80  # characters of a wrong value quoted in a message


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, SHOWN, SHOWN


def shown(value) -> str:
    """A value as a message quotes it, cut short without being expanded: YAML aliases share one object, and a full
    repr of nested ones (a "billion laughs" file) would run to gigabytes."""
    return _REPR.repr(value)


class HostError(InputError):
    """A host that is unknown, misconfigured, unreachable or runs an unusable TrainDeck: one line, exit 2."""


@dataclass
class Host:
    name: str
    ssh: str
    command: str = "traindeck"
    runs: str = "~/traindeck-runs"
    scheduler: str = "ssh"
    partition: str = ""
    ssh_options: list[str] = field(default_factory=list)

    @property
    def slurm(self) -> bool:
        return self.scheduler == "slurm"

    def describe(self) -> str:
        where = f"SLURM through {self.ssh}" if self.slurm else self.ssh
        return self.name if where == self.name else f"{self.name} ({where})"


def hosts_file() -> Path:
    env = os.environ.get("TRAINDECK_HOSTS")
    if env:
        return Path(env)
    return user_dir("config") / "hosts.yaml"


def _check(name: str, entry, path: Path) -> Host:
    where = f"{path}: hosts.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise HostError(f"{path}: host name {shown(name)}: use letters, digits, '.', '_' or '-' (at most 40)")
    if not isinstance(entry, dict):
        raise HostError(f"{where}: expected a mapping with ssh, command and runs")
    unknown = set(entry) - (set(Host.__dataclass_fields__) - {"name"})
    if unknown:
        raise HostError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                        f"(known: ssh, command, runs, scheduler, partition, ssh_options)")
    if not isinstance(entry.get("ssh"), str) or not entry["ssh"].strip():
        raise HostError(f"{where}.ssh: the SSH destination is missing (an alias of ~/.ssh/config or user@host)")
    if entry["ssh"].strip().startswith("-"):
        raise HostError(f"{where}.ssh: {shown(entry['ssh'])} starts with '-', which ssh would read as an option; "
                        f"give a destination (an alias of ~/.ssh/config or user@host)")
    if entry.get("scheduler", "ssh") not in SCHEDULERS:
        raise HostError(f"{where}.scheduler: {shown(entry['scheduler'])} is not one of {', '.join(SCHEDULERS)}")
    options = entry.get("ssh_options", [])
    if not isinstance(options, list) or not all(isinstance(o, (str, int)) for o in options):
        raise HostError(f"{where}.ssh_options: expected a list of ssh arguments, such as [-p, \"2222\"]")
    for key in ("command", "runs", "partition"):
        if key in entry and not isinstance(entry[key], str):
            raise HostError(f"{where}.{key}: expected text, got {shown(entry[key])}")
    return Host(name=str(name), ssh=entry["ssh"].strip(), command=entry.get("command", "traindeck"),
                runs=entry.get("runs", "~/traindeck-runs"), scheduler=entry.get("scheduler", "ssh"),
                partition=entry.get("partition", ""), ssh_options=[str(o) for o in options])


def load_hosts(path: Path | None = None) -> dict[str, Host]:
    path = path or hosts_file()
    hosts = _read_hosts_file(path).get("hosts")
    if hosts is None:
        return {}
    if not isinstance(hosts, dict):
        raise HostError(f"{path}: `hosts` must map names to hosts")
    return {str(name): _check(name, entry, path) for name, entry in hosts.items()}


def _read_hosts_file(path: Path) -> dict:
    """The parsed hosts file (`{}` when there is none); HostError naming the file when it cannot be used."""
    if not path.exists():
        return {}
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_HOSTS_FILE + 1)
        if len(raw) > MAX_HOSTS_FILE:
            raise HostError(f"{path}: more than {MAX_HOSTS_FILE >> 20} MB; a hosts file is a few lines")
        data = yaml.safe_load(raw.decode("utf-8")) or {}  # aliases stay shared objects, never copied
    except UnicodeDecodeError as e:
        raise HostError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except (OSError, yaml.YAMLError) as e:
        raise HostError(f"{path}: cannot read the hosts file: {str(e)[:300]}") from None
    if not isinstance(data, dict):
        raise HostError(f"{path}: expected a mapping with `hosts:` at the top, got {type(data).__name__}")
    return data


def get_host(name: str) -> Host:
    hosts = load_hosts()
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none yet"
        raise HostError(f"--host {name}: no such host in {hosts_file()} (known: {known}); add it with "
                        f"`main.py hosts add {name} --ssh DESTINATION --command 'PYTHON MAIN.PY' --runs DIR`")
    return hosts[name]


def save_host(host: Host) -> Path:
    path = hosts_file()
    _check(host.name, {k: v for k, v in asdict(host).items() if k != "name"}, path)
    data = _read_hosts_file(path)
    if data.get("hosts") is None:
        data["hosts"] = {}
    elif not isinstance(data["hosts"], dict):
        raise HostError(f"{path}: `hosts` must map names to hosts")
    entry = {k: v for k, v in asdict(host).items() if k != "name" and v not in ("", [])}
    data["hosts"][host.name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
    return path


def remove_host(name: str) -> Path:
    path = hosts_file()
    data = _read_hosts_file(path)
    if name not in (data.get("hosts") or {}):
        get_host(name)  # says there is no such host, and which there are
    del data["hosts"][name]
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
    return path

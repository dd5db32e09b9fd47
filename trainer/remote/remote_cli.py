"""The command line of remote runs: `hosts`, `agent` (the host side), `mirror`, `fetch`, and what `train`,
`resume`, `export`, `predict`, `check-data` and `probe-devices` do for a host. Torch-free; cli.py dispatches here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from trainer.core.config import ConfigError, RunConfig, load_config
from trainer.core.errors import InputError
from trainer.core.files import atomic_write_text
from trainer.core.rundir import RunDir, default_runs_dir, planned_run_dir, report_end, run_label
from trainer.core.system import on_stop
from trainer.remote.hosts import Host, HostError, get_host, hosts_file, load_hosts, remove_host, save_host
from trainer.remote.protocol import FrameError, parse_answer
from trainer.runs.commands import Agent, Auto, Export, Fetch, Hosts, Mirror


# ---- hosts ---------------------------------------------------------------------------------------
def cmd_hosts(args) -> int:
    from trainer.remote import ssh

    if args.action == "list":
        hosts = load_hosts()
        if args.json:
            print(json.dumps([{"name": h.name, "ssh": h.ssh, "scheduler": h.scheduler, "runs": h.runs,
                               "command": h.command, "label": h.describe()} for h in hosts.values()]))
        elif not hosts:
            print(f"no hosts yet ({hosts_file()}); add one with: main.py hosts add NAME --ssh DESTINATION "
                  f"--command 'PYTHON MAIN.PY' --runs DIR", file=sys.stderr)
        for h in hosts.values():
            if not args.json:
                print(f"{h.name}\t{h.scheduler}\t{h.ssh}\t{h.command}\t{h.runs}")
        return 0
    if not args.name:
        raise HostError(f"hosts {args.action}: give the host's name")
    if args.action == "add":
        if not args.ssh:
            raise HostError("hosts add: --ssh DESTINATION is needed (an alias of ~/.ssh/config or user@host)")
        host = Host(name=args.name, ssh=args.ssh, command=args.command or "traindeck", runs=args.runs or
                    "~/traindeck-runs", scheduler=args.scheduler, partition=args.partition or "",
                    ssh_options=args.ssh_option or [])
        print(f"saved host {host.describe()} in {save_host(host)}")
        return 0
    if args.action == "remove":
        print(f"removed {args.name} from {remove_host(args.name)}")
        return 0
    host = get_host(args.name)  # check
    info = ssh.check(host)
    print(json.dumps(info) if args.json else
          f"{host.name}: TrainDeck {info['traindeck']} (events v{info['events']}), Python {info['python']} at "
          f"{info['executable']}")
    return 0


# ---- the host side -------------------------------------------------------------------------------
def cmd_agent(args) -> int:
    if args.host:  # the app's remote folder browser and scan: the same command, there
        if args.action not in ("ls", "scan"):
            raise HostError(f"agent {args.action}: --host is for ls and scan; the rest runs there already")
        scan = args.action == "scan"  # its thumbnails and labels file go along; ls takes the path alone
        there = Agent(action=args.action, agent_args=args.agent_args, thumbs=args.thumbs, thumb_size=args.thumb_size,
                      labels=args.labels) if scan else Agent(action=args.action, agent_args=args.agent_args)
        return ask_checked(args.host, there.argv())
    from trainer.remote import agent

    a = args.agent_args
    if args.action == "version":
        print(json.dumps(agent.version()))
    elif args.action == "ls":
        print(json.dumps(agent.list_folder(a[0] if a else "~")))
    elif args.action == "scan":
        print(json.dumps(agent.scan(a[0], args.thumbs, args.thumb_size, args.labels)))
    elif args.action == "start":
        print(json.dumps(agent.start(sys.stdin.read(), args.runs, args.name)))
    elif args.action == "resume":
        print(json.dumps(agent.resume(a[0], args.epochs)))
    elif args.action == "submit":
        print(json.dumps(agent.submit(sys.stdin.read(), args.runs, args.partition or "", args.cpus_per_task)))
    elif args.action == "submit-auto":
        print(json.dumps(agent.submit_auto(a[0], args.minutes, a[1:], args.runs, args.partition or "",
                                           args.cpus_per_task, args.labels)))
    elif args.action == "follow":
        offsets = dict(item.split("=", 1) for item in args.offset)
        agent.Follower(a[0], {k: int(v) for k, v in offsets.items()}, args.job, args.job_output).follow()
    elif args.action == "stop":
        print(json.dumps(agent.stop(a[0], args.kill, args.job)))
    elif args.action == "send":
        agent.send(a[0], a[1])
    elif args.action == "pack":
        agent.pack([p for p in sys.stdin.buffer.read().decode("utf-8", "surrogateescape").split("\0") if p])
    return 0


# ---- the local side ------------------------------------------------------------------------------
def remote_train(cfg, args, choices: list[dict] | None = None, bring_exports: bool = False) -> int:
    """`main.py train` of a config whose device.host names a host: start it there (or sbatch it), make its mirror
    here, follow it until it ends (the app's Stop: SIGTERM to this process stops it there)."""
    from trainer.remote import ssh
    from trainer.remote.agent import START_WAIT_S

    host = get_host(cfg.device.host)
    ssh.check(host)
    local = _new_mirror_dir(args, host, cfg.model.name)
    cfg.device.host = ""  # there, it is a local run
    text = cfg.to_yaml()
    # Stop while the host starts the run is not lost: noted now, and the run is stopped there as soon as
    # it exists (killing this process here left a run going there that nobody could see or stop).
    stopped: list[float] = []
    undo_stop = on_stop(lambda why: stopped.append(time.time()))
    try:
        if host.slurm:
            answer = ssh.remote_json(host, Agent(action="submit", runs=host.runs, partition=host.partition).argv(),
                                     input=text, timeout=START_WAIT_S)
        else:
            answer = ssh.remote_json(host, Agent(action="start", runs=host.runs, name=local.name).argv(), input=text,
                                     timeout=START_WAIT_S)
    finally:
        undo_stop()
    return _follow_started(local, host, answer, args, stopped, choices, bring_exports)


def _new_mirror_dir(args, host: Host, label: str) -> RunDir:
    """Where a run on `host` is mirrored here: --run-dir, or a new folder under the runs folder's remote/HOST/."""
    from trainer.remote.mirror import mirrors_dir

    runs = args.runs_dir or default_runs_dir()
    local = RunDir(args.run_dir) if args.run_dir else planned_run_dir(mirrors_dir(runs, host.name), run_label(label))
    if local.path.exists() and any(local.path.iterdir()):
        raise HostError(f"{local.path}: already holds a run; train into a new directory")
    return local


def _follow_started(local: RunDir, host: Host, answer, args, stopped: list[float], choices: list[dict] | None,
                    bring_exports: bool) -> int:
    """A run the host has just started (or submitted): its mirror made here and followed to its end."""
    from trainer.remote.mirror import Mirror, create_mirror

    if not isinstance(answer, dict) or not isinstance(answer.get("run_dir"), str) or (
            host.slurm and not isinstance(answer.get("job"), int)):
        raise FrameError(f"{host.name}: the answer to the start has no run directory{' or job' if host.slurm else ''}: "
                         f"{str(answer)[:200]!r}")
    if host.slurm:
        print(f"submitted SLURM job {answer['job']} on {host.name}", flush=True)
    create_mirror(local, host, answer["run_dir"], answer.get("job"), answer.get("output"), args.output_log)
    if choices is not None:  # Auto's choices, kept with the run here as for a run trained here (the Runs page)
        atomic_write_text(local.auto_choices, json.dumps({"choices": choices}, indent=1))
    print(f"run directory: {local.path} (on {host.name}: {answer['run_dir']})", flush=True)
    mirror = Mirror(local)
    if stopped:
        print(f"stopping the run on {host.name}: Stop came while it was starting", flush=True)
        mirror.request_stop()
    elif args.detach:
        return 0
    code = report_end(local, mirror.follow())
    if bring_exports and code == 0:
        _bring_exports_home(local, load_config(local.config).export.formats)  # the config the host trained
    return code


def _bring_exports_home(run: RunDir, formats: list[str]) -> None:
    """The exports the host wrote at the run's end (and their cards), fetched into the mirror, as `main.py export`
    of the mirror would; one that is not there is said, and the run stays completed."""
    from trainer.core.catalog import EXPORT_FORMATS
    from trainer.remote.mirror import fetch

    for fmt in formats:
        name = f"exports/model{EXPORT_FORMATS[fmt]}"
        try:
            path = fetch(run, name)
            fetch(run, f"{name}.json")
        except HostError as e:
            print(f"warning: the {fmt} export did not come home ({e}); `main.py export {run.path}` makes it again",
                  file=sys.stderr, flush=True)
            continue
        print(f"exported: {path}", flush=True)


def remote_auto(args, say, started: float) -> int:
    """`main.py auto FOLDER --minutes N --host NAME`: on an SSH host, the plan made there (`remote_plan`) and trained
    there as a remote run; on a SLURM host, Auto inside a job (the job's node plans, then trains; the budget counts
    from the job's start). Either way the run is mirrored here and its export brought home."""
    from trainer.runs.prepare import choices_lines

    host = get_host(args.host)
    if host.slurm:
        code = _auto_job(host, args, say)
        print(f"time: {(time.time() - started) / 60:.1f} min here, the {args.minutes:g} min budget counted from the "
              f"job's start on {host.name}", flush=True)
        return code
    plan = remote_plan(host.name, args.folder, args.minutes, args.set, say, labels=args.labels)
    print("\n".join(choices_lines(plan["choices"])), flush=True)
    cfg = RunConfig.from_dict(plan["config"])  # (`auto --plan-only` there: train.min_epochs off, one run)
    # the seconds spent here beyond the host's own planning (ssh, this process) come out of the training budget too
    overhead_s = max(0.0, time.time() - started - float(plan["planning_s"]))
    cfg.train.budget = round(max(cfg.train.budget - overhead_s / 60, 0.01), 2)
    args.detach = False
    code = remote_train(cfg, args, plan["choices"], bring_exports=True)
    print(f"time: {(time.time() - started) / 60:.1f} min of the {args.minutes:g} min budget (planned and trained "
          f"on {host.name})", flush=True)
    return code


def _auto_job(host: Host, args, say) -> int:
    from trainer.remote import ssh
    from trainer.remote.agent import START_WAIT_S

    ssh.check(host)
    local = _new_mirror_dir(args, host, "auto")
    say(f"submitting Auto to {host.name}: the job's node scans, measures and plans, then trains "
        f"({args.minutes:g} min from the job's start; the time it pends is not spent)")
    stopped: list[float] = []
    undo_stop = on_stop(lambda why: stopped.append(time.time()))
    try:
        folder = f"./{args.folder}" if args.folder.startswith("-") else args.folder  # a value there, not an option
        submit = Agent(action="submit-auto", agent_args=[folder, *args.set], minutes=args.minutes, runs=host.runs,
                       partition=host.partition, labels=args.labels)
        answer = ssh.remote_json(host, submit.argv(), timeout=START_WAIT_S)
    finally:
        undo_stop()
    args.detach = False
    return _follow_started(local, host, answer, args, stopped, None, bring_exports=True)


def plans_in_job(host_name: str) -> dict | None:
    """`auto --plan-only --host NAME` on a SLURM host: no plan here or on its login node, which is not where the run
    will run; the answer says the plan is made inside the job (`main.py auto --host NAME` submits it). None for an
    SSH host, whose plan is made there now."""
    host = get_host(host_name)
    if not host.slurm:
        return None
    return {"in_job": True, "host": host.name,
            "why": f"{host.name} is a SLURM cluster: Auto scans, measures and plans on the node the job lands on, "
                   f"when the job starts (the time it pends is not spent)"}


def remote_plan(host_name: str, folder: str, minutes: float, overrides: list[str], say,
                labels: str | None = None) -> dict:
    """Auto's plan made on the host (`auto --plan-only` there: its scan, its speed probe on its devices, its
    learning-rate sweep; multi-label with `labels`, a labels file there), checked by the protocol and as a config;
    device.host set to the host, so it trains there."""
    from trainer.remote import ssh
    from trainer.remote.protocol import plan_answer

    host = get_host(host_name)
    ssh.check(host)
    say(f"planning on {host.name}: the scan, the speed probe and the learning-rate sweep run there")
    argv = Auto(folder=folder, minutes=minutes, plan_only=True, labels=labels, set=list(overrides or [])).argv()
    what = f"{host.name}: `auto --plan-only`"
    plan = plan_answer(parse_answer(ssh.remote_main(host, argv, timeout=minutes * 60 + 120).stdout, what), what)
    try:
        cfg = RunConfig.from_dict(plan["config"], source=f"the plan made on {host.name}")
    except ConfigError as e:
        raise FrameError(f"{what}: {e}") from None
    cfg.device.host = host.name
    plan["config"] = cfg.to_dict()
    plan["choices"].insert(0, {"key": "device.host", "value": host.name,
                               "why": f"--host {host.name}: scanned, measured and planned there, where it trains"})
    return plan


def remote_resume(run: RunDir, epochs: int | None, force: bool) -> int:
    from trainer.remote import ssh
    from trainer.remote.mirror import REMOTE_FILE, Mirror, remote_info

    info = remote_info(run)
    host = get_host(info["host"])
    ssh.check(host)
    if info.get("job"):
        raise HostError(f"{run.path}: a SLURM run is resumed by submitting it again; resume it on the cluster with "
                        f"`main.py resume {info['run_dir']}` inside a job")
    if run.is_live():
        raise HostError(f"{run.path}: the run is still going on {host.name}; stop it first")
    if run.read_status().get("state") == "completed" and not force and epochs is None:
        raise HostError(f"{run.path}: the run already completed; continue it with --epochs TOTAL")
    ssh.remote_json(host, Agent(action="resume", agent_args=[info["run_dir"]], epochs=epochs or None).argv())
    (run.path / REMOTE_FILE).touch()
    return report_end(run, Mirror(run).follow())


def cmd_mirror(args) -> int:
    """Follow a remote run into its mirror until it ends (the app re-attaches with this)."""
    from trainer.remote.mirror import Mirror

    run = RunDir(args.run_dir)
    return report_end(run, Mirror(run).follow())


def cmd_fetch(args) -> int:
    from trainer.remote.mirror import fetch

    print(fetch(RunDir(args.run_dir), args.file))
    return 0


def fetch_checkpoint(run: RunDir, which: str) -> None:
    """For a mirror: the checkpoint `which` (best, last) brought here when it is not yet (Try it, evaluate)."""
    from trainer.remote.mirror import fetch

    name = f"checkpoints/{which}.pt"
    if run.is_remote and not (run.path / name).exists():
        fetch(run, name)


def remote_export(run: RunDir, request: Export, out: Path) -> Path:
    """Export on the host (where the model's code, checkpoint and images are) as `request` asks (its --int8,
    --calibration ... passed on as they are), then bring the file and its model card home to `out`."""
    fmt = request.format
    from trainer.core.catalog import EXPORT_FORMATS
    from trainer.remote import ssh
    from trainer.remote.mirror import fetch, remote_info

    if fmt == "coreml":  # a folder, which the file fetch does not carry
        raise InputError(f"--format coreml: a Core ML package is a folder; export it on the host (main.py export "
                          f"there) and copy the {EXPORT_FORMATS['coreml']} folder")
    from trainer.deploy.model_card import out_problem

    problem = out_problem(fmt, out)  # here first: nothing is exported there for a file that cannot be written here
    if problem:
        raise InputError(problem)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=out.parent, prefix=".traindeck-write-check-").close()
    except OSError as e:
        raise InputError(f"--out: {out.parent}: cannot write there ({e.strerror or e})") from None
    info = remote_info(run)
    host = get_host(info["host"])
    ssh.check(host)
    name = f"exports/{out.name}"
    there = dataclasses.replace(request, run_dir=info["run_dir"], out=f"{info['run_dir']}/{name}")
    ssh.remote_main(host, there.argv(), timeout=1800)
    fetched = [fetch(run, name + suffix) for suffix in (".json", ".md", "")]  # all here before any is moved
    for path, suffix in zip(fetched, (".json", ".md", "")):  # the file last: a file here always has its card
        os.replace(path, f"{out}{suffix}")
    return out


def forward(host_name: str, argv: list[str]) -> int:
    """Run this command on the host instead (probe-devices, check-data): its output and exit code."""
    from trainer.remote import ssh

    host = get_host(host_name)
    ssh.check(host)
    done = ssh.remote_main(host, argv, check=False, timeout=600)
    sys.stdout.write(done.stdout.decode("utf-8", "replace"))
    sys.stderr.write(done.stderr.decode("utf-8", "replace"))
    return done.returncode


def ask_checked(host_name: str, argv: list[str]) -> int:
    """`agent ls` or `agent scan` on the host: its answer printed here once the protocol has checked it (the app reads
    this command's output, never the host's)."""
    from trainer.remote import ssh
    from trainer.remote.protocol import listing_answer, scan_answer

    host = get_host(host_name)
    ssh.check(host)
    what = f"{host.name}: `agent {argv[1]}`"
    answer = parse_answer(ssh.remote_main(host, argv, timeout=600).stdout, what)
    answer = listing_answer(answer, what) if argv[1] == "ls" else (scan_answer(answer, what) and answer)
    print(json.dumps(answer))
    return 0


def add_parsers(sub) -> None:
    for command, handler in ((Hosts, cmd_hosts), (Agent, cmd_agent), (Mirror, cmd_mirror), (Fetch, cmd_fetch)):
        command.add_parser(sub).set_defaults(func=handler)

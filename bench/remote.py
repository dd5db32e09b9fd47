"""Remote runs on a loopback host (a real sshd on 127.0.0.1, tests/servers/loopback_sshd.py): what following a run
over SSH costs, measured side by side with the same run trained here.

    .venv/bin/python bench/remote.py [--repeats 3]        (needs openssh-server; root for its /run/sshd)

- Start -> first step: from launching `main.py train` (here, or `--host loop`) to the first `step` event in the run
  directory the app reads (for the host: the mirror), which the app plots within its 40 ms poll.
- Event delay while following: for every event of a run, when it reached the mirror minus the `time` the trainer
  stamped in it (the bench polls the mirror's file every 2 ms).
- A dropped connection: the follow stream is killed mid-run; the time until events arrive again, and events lost or
  repeated (the mirror's events.jsonl against the host's, byte for byte).
Runs are interleaved (here, host, here, host, ...); medians are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from common import scratch  # noqa: E402
from servers.loopback_sshd import start_loopback_sshd, stop_loopback_sshd  # noqa: E402

from trainer.data.demo_data import write_demo_dataset  # noqa: E402


def read_lines(path: Path) -> list[dict]:
    try:
        data = path.read_bytes()
    except OSError:
        return []
    return [json.loads(line) for line in data.split(b"\n")[:-1] if line.strip()]


def watch(proc: subprocess.Popen, events_glob, drop_after_step: int | None = None) -> dict:
    """Poll the run's events file until the process ends: arrival time of each event (by index)."""
    t0 = time.perf_counter()
    t0_wall = time.time()
    arrivals: list[float] = []  # wall-clock arrival of event i
    first_step = None
    dropped_at = resumed_after = None
    events_path = None
    while proc.poll() is None:
        if events_path is None:
            found = list(events_glob())
            events_path = found[0] if found else None
        if events_path is not None:
            events = read_lines(events_path)
            now = time.time()
            while len(arrivals) < len(events):
                arrivals.append(now)
            steps = [e for e in events if e["event"] == "step"]
            if steps and first_step is None:
                first_step = time.perf_counter() - t0
            if drop_after_step is not None and dropped_at is None and len(steps) >= drop_after_step:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    if "follow" in " ".join(child.cmdline()):
                        child.kill()
                dropped_at, count_at_drop = time.time(), len(events)
            if dropped_at is not None and resumed_after is None and len(events) > count_at_drop:
                resumed_after = time.time() - dropped_at
        time.sleep(0.002)
    events = read_lines(events_path) if events_path else []
    now = time.time()
    while len(arrivals) < len(events):
        arrivals.append(now)
    delays = [a - e["time"] for a, e in zip(arrivals, events) if e["time"] >= t0_wall]
    return {"first_step_s": first_step, "delays": delays, "resumed_after_s": resumed_after, "events": events_path,
            "count": len(events)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    tmp = scratch("traindeck-bench-remote-")
    server = start_loopback_sshd(tmp)
    data = write_demo_dataset(tmp / "data", per_class=100, size=32, seed=0)
    hosts = tmp / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"loop": {
        "ssh": "loop", "command": f"{sys.executable} {REPO / 'main.py'}", "runs": str(tmp / "remote-runs"),
        "ssh_options": ["-F", str(server["config"])]}}}))
    env = dict(os.environ, TRAINDECK_HOSTS=str(hosts), OMP_NUM_THREADS="2")
    config = tmp / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"train_dir": str(data), "image_size": 32, "batch_size": 16, "num_workers": 0},
        "model": {"name": "small_cnn"}, "optimizer": {"name": "sgd", "lr": 0.05},
        "train": {"epochs": args.epochs, "seed": 0}, "monitor": {"log_every": 1}}))
    results: dict[str, list[dict]] = {"here": [], "host": [], "dropped": []}
    try:
        for i in range(args.repeats):
            for kind in ("here", "host", "dropped"):
                runs = tmp / f"runs-{kind}-{i}"
                argv = [sys.executable, str(REPO / "main.py"), "train", str(config), "--runs-dir", str(runs)]
                if kind != "here":
                    argv += ["--host", "loop"]
                where = (lambda r=runs: r.glob("*/events.jsonl")) if kind == "here" else \
                    (lambda r=runs: (r / "remote" / "loop").glob("*/events.jsonl"))
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                r = watch(proc, where, drop_after_step=20 if kind == "dropped" else None)
                out, err = proc.communicate()
                assert proc.returncode == 0, err
                if kind != "here":
                    remote = tmp / "remote-runs" / r["events"].parent.name / "events.jsonl"
                    r["identical"] = r["events"].read_bytes() == remote.read_bytes()
                    steps = [e["step"] for e in read_lines(r["events"]) if e["event"] == "step"]
                    r["repeated"] = len(steps) - len(set(steps))
                    r["lost"] = len(read_lines(remote)) - r["count"]
                results[kind].append(r)
                print(f"{kind} #{i + 1}: first step {r['first_step_s']:.2f} s, {r['count']} events", file=sys.stderr)
    finally:
        stop_loopback_sshd(server)

    def med(kind, key):
        return statistics.median(r[key] for r in results[kind])

    host_delays = [d for r in results["host"] for d in r["delays"]]
    here_delays = [d for r in results["here"] for d in r["delays"]]
    print(f"\n{args.repeats} repeats of each, interleaved; small_cnn, 400 images 32 px, {args.epochs} epochs, "
          f"log_every 1\n")
    print("| | here | on the loopback host | ratio |\n|---|---|---|---|")
    print(f"| Start -> first step in the run directory the app reads (median) | {med('here', 'first_step_s'):.2f} s | "
          f"{med('host', 'first_step_s'):.2f} s | {med('host', 'first_step_s') / med('here', 'first_step_s'):.2f} |")
    print(f"| event delay, median | {1000 * statistics.median(here_delays):.0f} ms | "
          f"{1000 * statistics.median(host_delays):.0f} ms | |")
    print(f"| event delay, worst | {1000 * max(here_delays):.0f} ms | {1000 * max(host_delays):.0f} ms | |")
    dropped = results["dropped"]
    print(f"\nA dropped connection (follow stream killed after 20 steps), {len(dropped)} runs: events again after "
          f"{statistics.median(r['resumed_after_s'] for r in dropped if r['resumed_after_s']):.2f} s (median), "
          f"worst {max(r['resumed_after_s'] or 0 for r in dropped):.2f} s; mirrors identical to the host's: "
          f"{sum(r['identical'] for r in dropped)}/{len(dropped)}; events lost {sum(r['lost'] for r in dropped)}, "
          f"repeated {sum(r['repeated'] for r in dropped)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

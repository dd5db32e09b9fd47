"""The host side of remote runs: what `main.py agent ...` does on a host when the app (or `--host`) asks over SSH.

Torch-free and quick, so each is one SSH round trip:
    version                      the handshake: TrainDeck version, event schema, protocol
    ls PATH                      a folder's sub-folders with their image counts (the remote folder browser)
    scan DIR                     the dataset scan (trainer.data.scan) with a few thumbnails per class
    start --runs R --name N      (config YAML on stdin) start `main.py train` detached; wait until pre-flight passed
    resume RUN [--epochs N]      start `main.py resume` detached
    submit --runs R              (config YAML on stdin) SLURM: check the request (sinfo), sbatch it
    follow RUN [--offset F=N]    stream the run's small files as JSON-line frames until it has ended
    stop RUN [--kill] [--job J]  ask the trainer's process tree to stop (or end it); scancel a job
    send RUN FILE                one file of the run: its size on a line, then its bytes
    pack                         (paths on stdin) those images as a tar stream (the error gallery's images)

A detached trainer is in a process tree of its own with its output in a file: it survives the SSH connection, the app
and the laptop's sleep. The `follow` frames and every name and limit are declared in trainer/remote/protocol.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from trainer.core.rundir import FINAL_STATES, RunDir
from trainer.core.system import detached, kill_tree, pid_alive, stop_tree
from trainer.remote.protocol import (
    APPENDED,
    EVAL_DIR,
    JOB_OUTPUT,
    MAX_APPEND_BYTES,
    MAX_WHOLE_BYTES,
    PROTOCOL,
    WHOLE,
    append_frame,
    file_frame,
    known_name,
)

POLL_S = 0.05
SLOW_POLL_EVERY = 20  # polls between looks at eval/ and at the SLURM job
JOB_END_WAIT_S = 20  # after the trainer's final state, how long to wait for its SLURM job to be over
START_WAIT_S = 600  # pre-flight (imports, the data scan) may take this long on a slow file system


def emit(frame: dict) -> None:
    sys.stdout.write(json.dumps(frame) + "\n")


def version() -> dict:
    from trainer import __version__
    from trainer.core.events import SCHEMA_VERSION

    return {"traindeck": __version__, "events": SCHEMA_VERSION, "protocol": PROTOCOL,
            "python": sys.version.split()[0], "executable": sys.executable, "home": os.path.expanduser("~")}


def list_folder(path: str) -> dict:
    from trainer.core.errors import InputError
    from trainer.data.scan import IMAGE_EXTENSIONS

    root = Path(os.path.expanduser(path or "~")).resolve()
    if not root.is_dir():
        raise InputError(f"{root}: no such folder")
    entries, files = [], []
    for child in sorted(root.iterdir(), key=lambda p: p.name.lower()):
        if child.name.startswith("."):
            continue
        if child.suffix.lower() == ".csv" and child.is_file():  # a labels file (data.labels) to choose
            files.append(child.name)
        if not child.is_dir():
            continue
        dirs = images = 0
        try:
            for i, e in enumerate(os.scandir(child)):
                if i > 2000:
                    break
                if e.is_dir():
                    dirs += 1
                elif e.name.lower().endswith(IMAGE_EXTENSIONS):
                    images += 1
        except OSError:
            pass
        entries.append({"name": child.name, "folders": dirs, "images": images})
    return {"path": str(root), "parent": str(root.parent), "entries": entries[:1000], "files": files[:1000]}


def scan(folder: str, thumbs_per_class: int, size: int, labels: str | None = None) -> dict:
    """The scan of an ImageFolder here (multi-label with `labels`, its labels file) and a few thumbnails of each
    class (label)."""
    from dataclasses import asdict

    from PIL import Image

    from trainer.data.labels import labelled_scan
    from trainer.data.scan import open_image, scan_image_folder

    folder = os.path.expanduser(folder)
    if labels:
        result = labelled_scan(os.path.expanduser(labels), "data.labels", folder)
        result.pairs = result.together()
        result.samples = [(path, tuple(map(int, on))) for path, on in result.samples]  # 0/1: half the JSON of 0.0/1.0
    else:
        result = scan_image_folder(folder, full=False)
    shows = (lambda on, index: on[index]) if labels else (lambda label, index: label == index)
    rng = random.Random(0)
    thumbs = []
    for label, name in enumerate(result.classes):
        paths = [p for p, lab in result.samples if shows(lab, label)]
        for path in rng.sample(paths, min(thumbs_per_class, len(paths))):
            try:
                with open_image(path) as im:
                    im = im.convert("RGB")
                    im.thumbnail((size, size))
                    out = io.BytesIO()
                    im.save(out, "PNG")
                thumbs.append([name, base64.b64encode(out.getvalue()).decode()])
            except (OSError, Image.DecompressionBombError):
                continue
    return {"result": asdict(result), "thumbs": thumbs}


# ---- starting ------------------------------------------------------------------------------------
def _detached(argv: list[str], output: Path) -> subprocess.Popen:
    from trainer.runs.launch import REPO_ROOT

    with open(output, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                **detached(dict(os.environ, PYTHONUNBUFFERED="1")))


def _refusal(output: Path, code: int) -> str:
    from trainer.core.errors import refusals
    from trainer.remote.ssh import last_line

    text = output.read_text(encoding="utf-8", errors="replace") if output.exists() else ""
    return refusals(text) or last_line(text) or f"the trainer exited with code {code} before the run started"


def start(config_text: str, runs: str, name: str) -> dict:
    """Start a run of the config (YAML) in RUNS/NAME, detached; return once its pre-flight passed (the run
    directory holds its config), or raise the trainer's refusal."""
    from trainer.core.errors import InputError
    from trainer.runs.launch import train_command

    runs_dir = Path(os.path.expanduser(runs)).resolve()
    pending = runs_dir / ".pending"
    pending.mkdir(parents=True, exist_ok=True)
    config, output = pending / f"{name}.yaml", pending / f"{name}.output.log"
    config.write_text(config_text, encoding="utf-8")
    run = RunDir(runs_dir / name)
    proc = _detached(train_command(config, run_dir=run.path, output_log=output), output)
    deadline = time.time() + START_WAIT_S
    while time.time() < deadline:
        if run.config.exists():
            config.unlink(missing_ok=True)
            return {"run_dir": str(run.path), "pid": proc.pid}
        code = proc.poll()
        if code is not None:
            message = _refusal(output, code)
            config.unlink(missing_ok=True)
            output.unlink(missing_ok=True)
            raise InputError(message)
        time.sleep(0.1)
    return {"run_dir": str(run.path), "pid": proc.pid, "note": "still in pre-flight"}


def resume(run_dir: str, epochs: int | None) -> dict:
    from trainer.core.errors import InputError
    from trainer.runs.launch import resume_command

    run = RunDir(os.path.expanduser(run_dir))
    before = run.read_status().get("started")
    proc = _detached(resume_command(run.path, epochs), run.output_log)
    while True:
        status = run.read_status()
        if status.get("pid") == proc.pid and status.get("started") != before:
            return {"run_dir": str(run.path), "pid": proc.pid}
        code = proc.poll()
        if code is not None:
            raise InputError(_refusal(run.output_log, code) if code == 2 else
                             f"resume exited with code {code}: {run.tail_log(3)}")
        time.sleep(0.1)


def submit(config_text: str, runs: str, partition: str, cpus_per_task: int | None) -> dict:
    """SLURM: the request checked against the partition, the script written beside the config, sbatch'ed."""
    from trainer.core.config import load_config
    from trainer.remote import slurm
    from trainer.runs.launch import REPO_ROOT, slurm_cpus_per_task, write_slurm_files

    runs_dir = Path(os.path.expanduser(runs)).resolve()
    folder = runs_dir / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw = folder / f"slurm-{stamp}.submitted.yaml"
    raw.write_text(config_text, encoding="utf-8")
    try:
        cfg = load_config(raw)
    finally:
        raw.unlink()
    from trainer.train.preflight import preflight

    preflight(cfg)  # a missing folder or a bad group is refused now, not after waiting in the queue
    cpus, _ = slurm_cpus_per_task(cfg, cpus_per_task)
    gpus = cfg.device.nproc if cfg.device.type == "cuda" else 0
    slurm.check_request(partition, cfg.device.nnodes, cpus, gpus)
    script = folder / f"slurm-{stamp}.sh"
    write_slurm_files(cfg, script, runs_dir, cpus_per_task)
    job = slurm.submit(str(script), partition, str(folder / "slurm-%j.out"), str(REPO_ROOT))
    return {"job": job, "run_dir": str(runs_dir / f"slurm-{job}"), "output": str(folder / f"slurm-{job}.out")}


AUTO_JOB_MAX_CPUS = 8  # an Auto job's CPU request when none is given: a node's CPUs, up to this many


def submit_auto(folder: str, minutes: float, overrides: list[str], runs: str, partition: str,
                cpus_per_task: int | None, labels: str | None = None) -> dict:
    """SLURM: Auto inside a job (slurm_auto_script), one GPU where the partition's nodes have them; the folder (and
    a multi-label run's labels file) checked now, not after the wait in the queue."""
    from trainer.core.errors import InputError
    from trainer.remote import slurm
    from trainer.runs.launch import REPO_ROOT, slurm_auto_script

    here = lambda path: str(Path(path).expanduser().resolve())  # noqa: E731 - the job starts in TrainDeck's folder
    if not Path(here(folder)).is_dir():
        raise InputError(f"{folder}: no such folder on this host")
    if labels and not Path(here(labels)).is_file():
        raise InputError(f"--labels: {labels}: no such file on this host")
    chosen = slurm.check_request(partition, 1, cpus_per_task or 1, 0)
    cpus = cpus_per_task or min(chosen.cpus, AUTO_JOB_MAX_CPUS)
    runs_dir = Path(os.path.expanduser(runs)).resolve()
    configs = runs_dir / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    script = configs / f"slurm-auto-{time.strftime('%Y%m%d-%H%M%S')}.sh"
    script.write_text(slurm_auto_script(here(folder), minutes, overrides, runs_dir, cpus, min(1, chosen.gpus),
                                        labels and here(labels)), encoding="utf-8")
    job = slurm.submit(str(script), partition, str(configs / "slurm-%j.out"), str(REPO_ROOT))
    return {"job": job, "run_dir": str(runs_dir / f"slurm-{job}"), "output": str(configs / f"slurm-{job}.out")}


def stop(run_dir: str, kill: bool, job: int | None) -> dict:
    from trainer.remote import slurm

    if job:
        if slurm.job_state(job)["active"]:
            slurm.cancel(job)
        return {"cancelled": job}
    run = RunDir(os.path.expanduser(run_dir))
    status = run.read_status()
    pid = status.get("pgid") or status.get("pid")
    if not run.is_live() or not pid:
        return {"signalled": None, "state": run.effective_state()}
    kill_tree(pid) if kill else stop_tree(pid)
    return {"signalled": pid}


def send(run_dir: str, name: str) -> None:
    from trainer.core.errors import InputError

    run = RunDir(os.path.expanduser(run_dir)).path.resolve()
    path = (run / name).resolve()
    if run not in path.parents or not path.is_file():
        raise InputError(f"{path}: no such file in the run directory {run}")
    size = path.stat().st_size
    out = sys.stdout.buffer
    out.write(f"{size}\n".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            out.write(chunk)
    out.flush()


def pack(paths: list[str]) -> None:
    import tarfile

    from trainer.data.scan import IMAGE_EXTENSIONS

    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for path in paths:
            if path.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(path):
                try:
                    tar.add(path, recursive=False)
                except OSError:
                    continue
    sys.stdout.buffer.flush()


# ---- following -----------------------------------------------------------------------------------
class Follower:
    """What changed in a run directory since the last look, as frames."""

    def __init__(self, run_dir: str, offsets: dict[str, int], job: int | None, job_output: str | None):
        self.run = RunDir(os.path.expanduser(run_dir))
        self.offsets = {name: offsets.get(name, 0) for name in APPENDED}
        self.seen: dict[str, tuple[int, int]] = {}
        self.job, self.job_output = job, job_output
        self.job_state: dict | None = None
        self.final_seen: float | None = None

    def _append_frames(self) -> list[dict]:
        frames = []
        for name in APPENDED:
            path = self.run.path / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            offset = self.offsets[name]
            if size < offset:  # replaced (a run trained anew in the directory): from the start
                offset = self.offsets[name] = 0
                frames.append({"t": "truncate", "file": name})
            if size == offset:
                continue
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(min(size - offset, MAX_APPEND_BYTES))
            end = data.rfind(b"\n") + 1  # complete lines only: a reader never gets half an event
            if not end:
                continue
            frames.append(append_frame(name, offset, data[:end]))  # bytes as they are: offsets stay exact
            self.offsets[name] = offset + end
        return frames

    def _whole_frames(self, with_eval: bool) -> list[dict]:
        names = list(WHOLE)
        eval_root = self.run.path / EVAL_DIR
        if with_eval and eval_root.is_dir():
            names += [n for n in (p.relative_to(self.run.path).as_posix() for p in eval_root.rglob("*") if p.is_file())
                      if known_name(n)]
        frames = []
        for name in names:
            path = self.run.path / name
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            if self.seen.get(name) == key or st.st_size > MAX_WHOLE_BYTES:
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            self.seen[name] = key
            frames.append(file_frame(name, data, **({"alive": self.alive()} if name == "status.json" else {})))
        return frames

    def alive(self) -> bool:
        """Whether the trainer still runs: its pid here, or for a SLURM job the job's state (its node may be
        another machine)."""
        if self.job:
            return bool(self.job_state and self.job_state["active"])
        status = self.run.read_status()
        return pid_alive(status.get("pid"))

    def ended(self) -> bool:
        if self.job and self.job_state is not None and not self.job_state["active"]:
            return True  # the job is over: whatever the run directory says is final
        status = self.run.read_status()
        if not status:
            return False
        if self.job and status.get("state") == "preempted":
            return False  # its job requeues itself and goes on in this run (or ends, which is seen above)
        if self.job and status.get("state") in FINAL_STATES:  # the job itself ends moments later: wait for it
            self.final_seen = self.final_seen or time.time()
            return time.time() - self.final_seen > JOB_END_WAIT_S
        return status.get("state") in FINAL_STATES or (status.get("state") != "queued" and not self.alive())

    def follow(self, beat_s: float = 5.0) -> None:
        from trainer.remote import slurm

        polls, last_beat = 0, time.time()
        while True:
            if not self.job and not self.run.path.is_dir():  # deleted there: nothing more will ever come
                emit({"t": "gone", "message": f"the run directory {self.run.path} is not on the host (deleted?)"})
                sys.stdout.flush()
                return
            slow = polls % SLOW_POLL_EVERY == 0
            if self.job and slow:
                state = slurm.job_state(self.job)
                if state != self.job_state:
                    self.job_state = state
                    emit({"t": "job", **state})
                    self.seen.pop("status.json", None)  # its `alive` changes with the job
            frames = self._append_frames() + self._whole_frames(with_eval=slow)
            for frame in frames:
                emit(frame)
            if frames or time.time() - last_beat > beat_s:
                if not frames:
                    emit({"t": "beat"})
                sys.stdout.flush()
                last_beat = time.time()
            if slow and self.ended():
                if self.job:
                    self.job_state = slurm.job_state(self.job)
                    emit({"t": "job", **self.job_state})
                    self.seen.pop("status.json", None)
                rest = self._append_frames() + self._whole_frames(with_eval=True)
                for frame in rest:
                    emit(frame)
                if self.job and not self.run.status_file.exists() and self.job_output:
                    path = Path(self.job_output)
                    data = path.read_bytes()[-MAX_WHOLE_BYTES:] if path.is_file() else b""
                    emit(file_frame(JOB_OUTPUT, data))
                emit({"t": "end"})
                sys.stdout.flush()
                return
            polls += 1
            time.sleep(POLL_S)

"""The local side of a remote run: its mirror, a run directory on this machine kept up to date from the host.

Torch-free. A mirror lives under the runs folder in `remote/HOST/NAME` and holds `remote.json` (the host, the run
directory there, the SLURM job) and copies of the run's small files: events.jsonl, train.log and output.log
appended from byte offsets (the local file's size is the offset, and only complete lines come, so a dropped
connection resumes with no event lost or repeated), status.json, config.yaml and eval/ whole when they change.
The Runs page, the Results tab, compare and Try it read a mirror as any run directory. Checkpoints and exports
stay on the host until asked for (`fetch`, with progress).

`follow()` runs until the run has ended, reconnecting when the connection drops; SIGTERM (the app's Stop) stops
the remote run (SIGTERM there, so it checkpoints; SIGKILL after the grace period when it does not end) and goes
on following until it has.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.core.errors import refusals
from trainer.core.files import atomic_write_bytes, atomic_write_text
from trainer.core.rundir import FINAL_STATES, RunDir
from trainer.core.summary import SummaryKeeper, summary_path
from trainer.core.system import detached, on_stop, try_lock
from trainer.remote.hosts import Host, HostError, get_host
from trainer.remote.protocol import (
    APPENDED,
    MAX_FRAME_LINE,
    MAX_HEADER_BYTES,
    MAX_IMAGE_BYTES,
    FrameError,
    fetchable_name,
    inside,
    mirror_path,
    parse_size_header,
    read_frame,
    read_line,
)
from trainer.runs import commands

log = logging.getLogger(__name__)

REMOTE_FILE = "remote.json"
MIRROR_LOCK = ".mirror.lock"
MIRROR_PID = ".mirror.pid"  # the follower's pid (beside its lock: on Windows a locked file cannot be read)
MIRROR_LOG = "mirror.log"  # this side's own output (the remote's output.log is mirrored as itself)
EXIT_CODES = (0, 1, 2, 3)  # completed or stopped, failed, bad input, diverged (trainer/train/engine.py)
RETRY_S = (1, 2, 4, 8, 10)
KILL_AFTER_S = 30  # after Stop, SIGKILL there when the run has not ended by then
GIVE_UP_AFTER_STOP_S = KILL_AFTER_S + 15  # after Stop, a host that cannot be reached or read is followed no longer
MAX_BAD_STREAMS = 3  # connections in a row that ended in a malformed frame before the follower gives up


class Desync(Exception):
    """A frame's offset does not match the local file: reconnect from the local sizes."""


def mirrors_dir(runs_dir: str | os.PathLike, host: str) -> Path:
    return Path(runs_dir) / "remote" / host


def remote_info(run: RunDir) -> dict | None:
    try:
        return json.loads((run.path / REMOTE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def create_mirror(run: RunDir, host: Host, remote_dir: str, job: int | None = None, job_output: str | None = None,
                  output_log: str | os.PathLike | None = None) -> RunDir:
    run.path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run.path / REMOTE_FILE, json.dumps({
        "host": host.name, "ssh": host.ssh, "run_dir": remote_dir, "job": job, "job_output": job_output,
        "scheduler": host.scheduler, "created": time.time()}, indent=1))
    if output_log is not None and Path(output_log).exists():
        os.replace(output_log, run.path / MIRROR_LOG)
    if job:
        _write_status(run, {"state": "starting", "message": f"SLURM job {job} submitted"},
                      {"alive": True, "connected": True, "job": {"job": job, "state": "PENDING", "reason": ""}})
    return run


def _write_status(run: RunDir, status: dict, remote: dict) -> None:
    status = dict(status, remote=dict(remote, seen=time.time()))
    atomic_write_text(run.status_file, json.dumps(status, indent=1))


def mirror_pid(run: RunDir) -> int | None:
    """The pid of the process following this mirror now, or None (nobody follows it)."""
    handle = try_lock(run.path / MIRROR_LOCK) if run.path.is_dir() else None
    if handle is not None:
        handle.close()
        return None
    try:
        return int((run.path / MIRROR_PID).read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


class Mirror:
    def __init__(self, run: RunDir, out=None):
        self.run = run
        info = remote_info(run)
        if info is None:
            raise HostError(f"{run.path}: not a remote run (no {REMOTE_FILE})")
        self.info = info
        self.host = get_host(info["host"])
        self.out = out or sys.stderr
        self.remote: dict = {"alive": True, "connected": False}
        self.job_state: dict | None = None
        self.stop_requested: float | None = None
        self.reconnects = 0
        self.lost_s = 0.0  # time spent disconnected
        self.bad_streams = 0  # connections in a row that ended in a malformed frame
        self.summary: SummaryKeeper | None = None  # the mirror's own summary of its events.jsonl, as it is appended

    # ---- frames ----------------------------------------------------------------------------------
    def offsets(self) -> dict[str, int]:
        out = {}
        for name in APPENDED:
            try:
                out[name] = (self.run.path / name).stat().st_size
            except OSError:
                out[name] = 0
        return out

    def apply(self, frame: dict) -> bool:
        """Take in one frame checked by `trainer.remote.protocol` (its data as bytes); True at the end of the run. Files
        are written only where the protocol allows, inside the mirror."""
        kind = frame["t"]
        if kind == "append":
            path = mirror_path(self.run.path, frame["file"])
            size = path.stat().st_size if path.exists() else 0
            if size != frame["offset"]:
                raise Desync(f"{frame['file']}: have {size} bytes, the host sent from {frame['offset']}")
            if path == self.run.events and self.summary is None:
                self.summary = SummaryKeeper.resume(path)  # taken up from an earlier mirror process's
            with open(path, "ab") as f:
                f.write(frame["data"])
            if path == self.run.events:
                self.summary.add_appended(frame["data"])
                self.summary.maybe_write()
        elif kind == "truncate":
            path = mirror_path(self.run.path, frame["file"])
            path.write_bytes(b"")
            if path == self.run.events:
                self.summary = None
                summary_path(path).unlink(missing_ok=True)
        elif kind == "file":
            if frame["file"] == "status.json":
                self.remote["alive"] = frame.get("alive", True)
                try:
                    status = json.loads(frame["data"])
                except (json.JSONDecodeError, UnicodeDecodeError):
                    status = None
                if not isinstance(status, dict):
                    raise FrameError(f"status.json from the host is not a JSON object: {frame['data'][:80]!r}")
                self._status(status)
            else:
                path = mirror_path(self.run.path, frame["file"])  # checked before any folder is made
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(path, frame["data"])
        elif kind == "job":
            self.job_state = {k: frame.get(k) for k in ("job", "state", "reason", "active")}
            self.remote["job"] = self.job_state
            self.remote["alive"] = bool(frame.get("active"))
            status = self.run.read_status()
            if not (self.run.path / "config.yaml").exists():  # no run directory there yet: the job's state is all
                reason = f" ({frame['reason']})" if frame.get("reason") else ""
                status.update(state="starting" if frame.get("active") else "failed",
                              message=f"SLURM job {frame['job']}: {frame['state'].lower()}{reason}")
            self._status(status)
        elif kind == "gone":
            self.write_summary()
            status = self.run.read_status()
            status.update(state="failed", message=f"{self.host.name}: {frame.get('message') or 'the run is gone'}")
            self.remote["alive"] = False
            self._status(status)
            return True
        elif kind == "end":
            self.write_summary()
            self._fetch_gallery()
            self._finish()
            return True
        return False

    def write_summary(self) -> None:
        if self.summary is not None:
            self.summary.write()

    def _fetch_gallery(self) -> None:
        """The images the Results tab's error gallery shows (the worst GALLERY_IMAGES of each evaluation)."""
        try:
            fetch_images(self.run, gallery_paths(self.run), out=self.out)
        except (HostError, OSError) as e:
            self.note(f"the error gallery's images were not fetched: {e}")
            return
        for metrics in self.run.evaluations.glob("*/metrics.json"):
            os.utime(metrics)  # a viewer re-reads the evaluation: its images are here now

    def _status(self, status: dict) -> None:
        status.pop("remote", None)
        job = self.job_state or {}
        if status.get("state") == "preempted" and job.get("active"):  # requeued: it goes on in this run
            reason = f" ({job['reason']})" if job.get("reason") else ""
            status["message"] = (f"preempted and requeued; SLURM job {job.get('job')}: {str(job.get('state')).lower()}"
                                 f"{reason}; it goes on from its checkpoint when it starts again")
        _write_status(self.run, status, self.remote)

    def _finish(self) -> None:
        status = self.run.read_status()
        self.remote["alive"] = False
        if status.get("state") not in FINAL_STATES:  # ended without saying how: killed, or refused in a job
            slurm_out = self.run.path / "slurm.out"
            said = refusals(slurm_out.read_text(errors="replace")) if slurm_out.exists() else ""
            job = self.job_state or {}
            status.update(state="failed", message=said or (
                f"SLURM job {job.get('job')} ended {job.get('state', '').lower()} without a word from the trainer"
                if job else "the trainer on the host is gone (killed or crashed); resume continues from the last "
                            "checkpoint"))
        self._status(status)

    # ---- following -------------------------------------------------------------------------------
    def follow_argv(self) -> list[str]:
        from trainer.remote.ssh import command_argv

        job = self.info.get("job")
        follow = commands.Agent(action="follow", agent_args=[self.info["run_dir"]],
                                offset=[f"{name}={size}" for name, size in self.offsets().items()], job=job or None,
                                job_output=self.info.get("job_output") if job else None)
        return command_argv(self.host, follow.argv())

    def note(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self.out, flush=True)

    def follow(self) -> int:
        """Keep the mirror up to date until the run has ended; the run's exit code."""
        from trainer.remote import ssh

        lock = try_lock(self.run.path / MIRROR_LOCK)
        if lock is None:
            raise HostError(f"{self.run.path}: already followed by pid {mirror_pid(self.run)}")
        atomic_write_text(self.run.path / MIRROR_PID, str(os.getpid()))
        undo_stop = on_stop(lambda why: self.request_stop())
        try:
            attempt, lost_since = 0, None
            while True:
                try:
                    ssh.connect(self.host)
                    proc = subprocess.Popen(self.follow_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, **detached(own_tree=False))
                except (HostError, OSError) as e:
                    proc, said = None, str(e)
                if proc is not None:
                    if lost_since is not None:
                        self.lost_s += time.time() - lost_since
                        self.note(f"reconnected to {self.host.name} after {time.time() - lost_since:.1f} s")
                        lost_since = None
                    self.remote["connected"] = True
                    ended, said = self._read(proc)
                    if ended:
                        return self.exit_code()
                    attempt = 0 if said == "desync" else attempt
                    if self.bad_streams >= MAX_BAD_STREAMS:
                        raise HostError(f"{self.host.name}: gave up following {self.info['run_dir']}: the host sent "
                                        f"what the protocol does not allow, {self.bad_streams} times ({said}); see "
                                        f"{self.run.path / MIRROR_LOG}")
                if self.stop_requested and time.time() - self.stop_requested > GIVE_UP_AFTER_STOP_S:
                    self.note(f"stopped following: {self.host.name} has not confirmed the stop in "
                              f"{GIVE_UP_AFTER_STOP_S} s ({said}); follow it again with main.py mirror {self.run.path}")
                    return self.exit_code()
                lost_since = lost_since or time.time()
                if self.remote.get("connected"):
                    self.remote["connected"] = False
                    self._status(self.run.read_status())
                self.reconnects += 1
                wait = RETRY_S[min(attempt, len(RETRY_S) - 1)]
                self.note(f"connection to {self.host.name} lost ({said}); the run goes on there; "
                          f"reconnecting in {wait} s")
                attempt += 1
                self._sleep(wait)
        finally:
            self.write_summary()  # what the app reads when it opens the run
            undo_stop()
            lock.close()

    def _read(self, proc: subprocess.Popen) -> tuple[bool, str]:
        try:
            while line := read_line(proc.stdout, MAX_FRAME_LINE, f"{self.host.name}: follow"):
                try:
                    if self.apply(read_frame(line)):
                        proc.wait()
                        return True, ""
                except Desync as e:
                    self.note(f"resynchronising: {e}")
                    proc.kill()
                    return False, "desync"
                self.bad_streams = 0
                self._escalate()
        except FrameError as e:
            self.bad_streams += 1
            self.note(f"malformed frame from {self.host.name}, resynchronising: {e}")
            return False, f"malformed frame: {e}"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        stderr = proc.stderr.read().decode("utf-8", "replace")
        from trainer.remote.ssh import describe_ssh_failure, last_line

        return False, (describe_ssh_failure(self.host, stderr) if proc.returncode == 255
                       else last_line(stderr) or f"exit code {proc.returncode}")

    def _sleep(self, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(0.1)
            self._escalate()

    # ---- stopping --------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """SIGTERM on the host (in the background: this runs in a signal handler)."""
        if self.stop_requested is None:
            self.stop_requested = time.time()
            threading.Thread(target=self._stop_remote, args=(False,), daemon=True).start()

    def _escalate(self) -> None:
        if self.stop_requested and time.time() - self.stop_requested > KILL_AFTER_S and not self.info.get("job"):
            self.stop_requested = float("inf")  # once
            threading.Thread(target=self._stop_remote, args=(True,), daemon=True).start()

    def _stop_remote(self, kill: bool) -> None:
        from trainer.remote.ssh import remote_main

        args = commands.Agent(action="stop", agent_args=[self.info["run_dir"]], kill=kill,
                              job=self.info.get("job") or None).argv()
        for _ in range(30):  # the host may be unreachable just now: keep trying
            try:
                remote_main(self.host, args, timeout=60)
                self.note(f"{'killed' if kill else 'stopping'} the run on {self.host.name}")
                return
            except HostError as e:
                self.note(f"cannot stop the run yet: {e}")
                time.sleep(2)

    def exit_code(self) -> int:
        status = self.run.read_status()
        code = status.get("exit_code")
        if code in EXIT_CODES:  # the trainer's own codes; a host's other number (259 would read as 3 here) is not
            return code
        return 0 if status.get("state") in ("completed", "stopped") else 1


GALLERY_IMAGES = 200  # per evaluation, the highest-loss errors
FILES = "files"  # under a mirror: copies of the host's images, at their path there


def local_copy(run_path: str | os.PathLike, path: str) -> str:
    """Where this machine has an image of a remote run's predictions (its copy in the mirror), else `path`."""
    copy = Path(run_path) / FILES / path.lstrip("/")
    return str(copy) if copy.exists() else path


def gallery_paths(run: RunDir) -> list[str]:
    from trainer.core.csvfile import read_dict_rows

    paths: list[str] = []
    for csv_path in sorted(run.evaluations.glob("*/predictions.csv")):
        errors: list[tuple[float, str]] = []
        try:
            with open(csv_path, newline="", encoding="utf-8") as f:
                for r in read_dict_rows(f):  # the host wrote this file: a row without its columns is passed over
                    loss = _number(r.get("loss"))
                    if isinstance(r.get("path"), str) and r.get("true") != r.get("predicted") and loss is not None:
                        errors.append((loss, r["path"]))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            log.warning("%s: not read (%s)", csv_path, e)
            continue
        errors.sort(key=lambda e: -e[0])
        paths += [path for _, path in errors[:GALLERY_IMAGES]]
    return list(dict.fromkeys(paths))


def _number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value else None  # NaN is no loss to sort by


def fetch_images(run: RunDir, paths: list[str], out=None) -> int:
    """Copy the host's images at `paths` into the mirror's files/ (one tar stream); how many came."""
    import tarfile

    from trainer.remote.ssh import command_argv, connect

    paths = [p for p in paths if not (run.path / FILES / p.lstrip("/")).exists()]
    if not paths:
        return 0
    info = remote_info(run)
    host = get_host(info["host"])
    connect(host)
    pack = commands.Agent(action="pack")
    proc = subprocess.Popen(command_argv(host, pack.argv()), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        proc.stdin.write("\0".join(paths).encode("utf-8", "surrogateescape") + b"\0")  # a name may hold a newline
        proc.stdin.close()
    except BrokenPipeError:  # it ended before reading them: what it sent (if anything) is read below
        pass
    count = 0
    root = run.path / FILES
    root.mkdir(parents=True, exist_ok=True)
    wanted = {p.lstrip("/") for p in paths}
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                # only the images asked for, as plain files of a bounded size, inside files/ (the rest is skipped
                # as the stream goes past: never held in memory)
                if not member.isfile() or member.size > MAX_IMAGE_BYTES or member.name.lstrip("/") not in wanted:
                    continue
                try:
                    target = inside(root, member.name.lstrip("/"))
                except FrameError:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                part = target.with_name(target.name + ".part")
                with tar.extractfile(member) as source, open(part, "wb") as f:
                    shutil.copyfileobj(source, f, 1 << 20)
                os.replace(part, target)
                count += 1
    except tarfile.TarError as e:
        raise HostError(f"{host.name}: the gallery images came incomplete ({e})") from None
    finally:
        proc.wait()
    print(f"fetched {count} gallery images from {host.name}", file=out or sys.stderr, flush=True)
    return count


def fetch(run: RunDir, name: str, out=None) -> Path:
    """Copy one file of a remote run into its mirror (atomically), with progress on `out`; its local path."""
    from trainer.remote.ssh import command_argv, connect, describe_ssh_failure, last_line

    info = remote_info(run)
    if info is None:
        raise HostError(f"{run.path}: not a remote run (no {REMOTE_FILE})")
    host = get_host(info["host"])
    out = out or sys.stderr
    if not fetchable_name(name):
        raise HostError(f"{name!r}: only a file under checkpoints/ or exports/ of the run can be fetched")
    target = inside(run.path, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    connect(host)
    send = commands.Agent(action="send", agent_args=[info["run_dir"], name])
    proc = subprocess.Popen(command_argv(host, send.argv()), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        header = read_line(proc.stdout, MAX_HEADER_BYTES, f"{host.name}: send {name}")
        if not header:
            proc.wait()
            stderr = proc.stderr.read(64 << 10).decode("utf-8", "replace")
            raise HostError(describe_ssh_failure(host, stderr) if proc.returncode == 255 else
                            f"{host.name}: cannot fetch {name}: {last_line(stderr).removeprefix('error: ')}")
        size, done, shown = parse_size_header(header, f"{host.name}: send {name}"), 0, -1
        with open(part, "wb") as f:
            while done < size:
                chunk = proc.stdout.read(min(1 << 20, size - done))
                if not chunk:
                    break
                f.write(chunk)
                done += len(chunk)
                percent = 100 * done // max(size, 1)
                if percent != shown:
                    shown = percent
                    print(f"fetching {name} from {host.name}: {percent}% ({done / 1e6:.1f}/{size / 1e6:.1f} MB)",
                          file=out, flush=True)
        proc.wait()
        if done != size:
            raise HostError(f"{host.name}: the connection dropped while fetching {name} ({done} of {size} bytes); "
                            f"fetch it again")
        os.replace(part, target)
    finally:
        if proc.poll() is None:
            proc.kill()
        part.unlink(missing_ok=True)
    return target

"""A run's summary file (`trainer.core.summary`): what the app, Compare, resume and the model card read of a long run
instead of its whole event file. The curves it gives are the full file's, within its thinning, for a live run read
part-way, a resumed run and a remote run's mirror."""

from __future__ import annotations

import json
import math

import pytest

from app.state.run_state import RunState
from trainer.core import summary as summary_module
from trainer.core.events import EventTail, EventWriter, read_events
from trainer.core.rundir import RunDir
from trainer.core.summary import SummaryKeeper, read_header

STEPS_PER_EPOCH = 500


def emit_steps(writer: EventWriter, first: int, last: int, spike: int | None = None) -> None:
    """Steps first..last of a run whose loss falls with noise; one spike; an epoch, grad stats and system samples
    at their usual rates."""
    for step in range(first, last + 1):
        loss = 2.0 / math.sqrt(step) + 0.05 * math.sin(step * 1.7)
        writer.emit("step", step=step, epoch=(step - 1) // STEPS_PER_EPOCH + 1, batch=(step - 1) % STEPS_PER_EPOCH + 1,
                    batches=STEPS_PER_EPOCH, loss=50.0 if step == spike else loss, lr=[0.1], images_per_s=900.0,
                    grad_norm=1.0)
        if step % 10 == 0:
            writer.emit("grad_stats", step=step, grad_norm=[1.0, step / 1000], weight_norm=[1, 1], update_ratio=[0, 0],
                        zero_frac=[0, 0])
        if step % 100 == 0:
            writer.emit("system", cpu_percent=50.0, rss_mb=100.0 + step / 1000)
        if step % STEPS_PER_EPOCH == 0:
            epoch = step // STEPS_PER_EPOCH
            writer.emit("epoch", epoch=epoch, train_loss=1 / epoch, val_loss=1.1 / epoch, val_acc=0.5 + epoch / 100)


def start(writer: EventWriter, step: int = 0, epoch: int = 0) -> None:
    writer.emit("run_start", config={"train": {"epochs": 100}}, classes=["a", "b"], param_groups=[{"name": "all"}],
                layers=["conv", "fc"], start_step=step, start_epoch=epoch)


def state_of(run: RunDir, summary: bool) -> RunState:
    state = RunState(run)
    tail = EventTail(run.events, summary=summary)
    while batch := tail.read_new(64 << 10):
        for e in batch:
            state.apply(e, now=0.0)
    return state


def assert_same_run(thinned: RunState, full: RunState, bounded: bool = True) -> None:
    """What a user reads of the run: every epoch, the best, the end, the last step the same; the loss curve a
    subset of the full one, with each bucket's lowest and highest point (a spike stays) and the last."""
    assert thinned.epoch_events == full.epoch_events
    assert thinned.best_epoch == full.best_epoch and thinned.end_event == full.end_event
    assert thinned.last_step == full.last_step and thinned.layer_table == full.layer_table
    assert (thinned.state, thinned.segments, thinned.epochs) == (full.state, full.segments, full.epochs)
    assert list(thinned.val_score.y) == list(full.val_score.y)
    points = dict(zip(full.step_loss.x.tolist(), full.step_loss.y.tolist()))
    shown = dict(zip(thinned.step_loss.x.tolist(), thinned.step_loss.y.tolist()))
    assert shown.items() <= points.items(), "every point of the thinned curve is the run's own"
    assert max(shown.values()) == max(points.values()) and min(shown.values()) == min(points.values())
    if bounded:
        assert len(shown) <= 2 * summary_module.BUDGET["step"] + 1 < len(points)


def assert_envelope(run: RunDir) -> None:
    """Each bucket of the summary's step series holds the lowest and highest loss of the steps it covers."""
    header = read_header(run.summary, run.events)
    width, count = header["series"]["step"]
    full = [e["loss"] for e in read_events(run.events) if e["event"] == "step"]
    kept = {}
    for (name, position, _), line in zip(header["positions"], run.summary.read_text().splitlines()[1:]):
        if name == "step":
            kept.setdefault(position // width, []).append(json.loads(line)["loss"])
    assert count == len(full)
    for bucket in range(0, count // width, 7):
        covered = full[bucket * width:(bucket + 1) * width]
        assert min(covered) in kept[bucket] and max(covered) in kept[bucket]


def test_a_long_run_read_through_its_summary_shows_the_same_run_with_a_bounded_curve(tmp_path):
    run = RunDir(tmp_path / "run").create()
    writer = EventWriter(run.events)
    start(writer)
    emit_steps(writer, 1, 20_000, spike=12_345)
    writer.emit("test", accuracy=0.9, images=10)
    writer.emit("run_end", status="completed", message="", epochs_completed=40)
    writer.close()
    assert run.summary.stat().st_size < run.events.stat().st_size / 4
    full, thinned = state_of(run, summary=False), state_of(run, summary=True)
    assert_same_run(thinned, full)
    assert 12_345 in thinned.step_loss.x.tolist(), "the one-step spike is kept"
    assert thinned.test_event == full.test_event
    assert_envelope(run)
    assert len(thinned.cpu) <= summary_module.BUDGET["system"] + 1


def test_a_live_run_opened_part_way_reads_the_summary_then_the_events_after_it(tmp_path, monkeypatch):
    """The app opens a run while it trains: the summary written a while ago, then every event written since, in
    order; a run read to its end that way is the one the full file gives."""
    run = RunDir(tmp_path / "run").create()
    monkeypatch.setattr(summary_module, "WRITE_EVERY_S", 1e9)  # written when the test says, then at the close
    writer = EventWriter(run.events)
    start(writer)
    emit_steps(writer, 1, 6_000)
    writer.summary.write()
    emit_steps(writer, 6_001, 9_000)
    state, tail = RunState(run), EventTail(run.events, summary=True)
    assert tail.from_summary
    while batch := tail.read_new(64 << 10):
        for e in batch:
            state.apply(e, now=0.0)
    assert state.last_step["step"] == 9_000, "the events after the summary are read too"
    steps = state.step_loss.x.tolist()
    assert steps == sorted(steps) and set(range(6_001, 9_001)) <= set(steps), "after the summary: every step"
    emit_steps(writer, 9_001, 10_000)  # and as the run goes on, the tail follows it
    writer.emit("run_end", status="completed", message="")
    for e in tail.read_new():
        state.apply(e, now=0.0)
    writer.close()
    assert_same_run(state, state_of(run, summary=False), bounded=False)  # what came after the summary: every step


def test_a_resumed_run_takes_up_its_summary_after_a_crash_mid_line(tmp_path, monkeypatch):
    """A trainer killed mid-line, then resumed from its checkpoint at step 7,000: the resumed writer takes up the
    summary (the file is not read whole again), ends the cut line, and the summary is the one a reader building it
    from the whole file would make; the superseded steps go, as from the full file."""
    run = RunDir(tmp_path / "run").create()
    writer = EventWriter(run.events)
    start(writer)
    emit_steps(writer, 1, 8_200)
    writer.close()
    with open(run.events, "a", encoding="utf-8") as f:
        f.write('{"event": "step", "step": 8201, "lo')  # killed mid-line
    covered, size = read_header(run.summary, run.events)["offset"], run.events.stat().st_size
    read = []
    taken = SummaryKeeper.add_appended
    monkeypatch.setattr(SummaryKeeper, "add_appended", lambda self, data: read.append(len(data)) or taken(self, data))
    resumed = EventWriter(run.events)
    assert sum(read) == size - covered > 0, "only what the summary did not cover is read"
    start(resumed, step=7_000, epoch=14)
    emit_steps(resumed, 7_001, 15_000)
    resumed.emit("run_end", status="completed", message="")
    resumed.close()
    written = run.summary.read_text()
    run.summary.unlink()
    rebuilt = SummaryKeeper.resume(run.events)
    rebuilt.write()
    assert run.summary.read_text() == written, "the taken-up summary is the one the whole file gives"
    full, thinned = state_of(run, summary=False), state_of(run, summary=True)
    assert full.segments == 2 and max(full.step_loss.x) == 15_000
    assert_same_run(thinned, full)


def test_a_remote_run_s_mirror_keeps_its_own_summary_of_the_bytes_it_is_sent(tmp_path, monkeypatch):
    """The host's events arrive in append frames cut anywhere, across reconnects (a new mirror process each time):
    the mirror's summary reads as its events file does."""
    import base64

    import yaml

    from trainer.remote.hosts import get_host
    from trainer.remote.mirror import Mirror, create_mirror
    from trainer.remote.protocol import read_frame

    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"h": {"ssh": "h.invalid", "command": "traindeck", "runs": "/r"}}}))
    monkeypatch.setenv("TRAINDECK_HOSTS", str(hosts))
    mirror_run = create_mirror(RunDir(tmp_path / "runs" / "remote" / "h" / "run"), get_host("h"), "/r/run")
    host_run = RunDir(tmp_path / "host" / "run").create()

    def connect_and_follow() -> None:
        """One mirror process: what the host has written since, in frames that end mid-line, then it goes."""
        mirror = Mirror(mirror_run)
        data = host_run.events.read_bytes()[mirror.offsets()["events.jsonl"]:]
        for cut in range(0, len(data), 100_003):
            frame = {"t": "append", "file": "events.jsonl", "offset": mirror.offsets()["events.jsonl"],
                     "b64": base64.b64encode(data[cut:cut + 100_003]).decode()}
            mirror.apply(read_frame(json.dumps(frame).encode() + b"\n"))
        mirror.write_summary()

    writer = EventWriter(host_run.events)
    start(writer)
    for first, last in ((1, 3_000), (3_001, 7_000), (7_001, 10_000)):
        emit_steps(writer, first, last)
        connect_and_follow()
    writer.emit("run_end", status="completed", message="")
    writer.close()
    connect_and_follow()
    assert mirror_run.events.read_bytes() == host_run.events.read_bytes()
    assert read_header(mirror_run.summary, mirror_run.events)["offset"] == mirror_run.events.stat().st_size
    assert_same_run(state_of(mirror_run, summary=True), state_of(host_run, summary=False))


@pytest.mark.parametrize("damage", ["other file", "cut short", "garbage"])
def test_a_summary_that_does_not_describe_the_file_is_not_used(tmp_path, damage):
    run = RunDir(tmp_path / "run").create()
    writer = EventWriter(run.events)
    start(writer)
    emit_steps(writer, 1, 3_000)
    writer.close()
    if damage == "other file":  # the run directory reused: a new events.jsonl beside an old summary
        run.events.write_text(json.dumps({"event": "run_start", "v": 1, "time": 1.0, "config": {}}) + "\n")
    elif damage == "cut short":
        with open(run.events, "r+b") as f:
            f.truncate(1000)
    else:
        run.summary.write_text("not json\n")
    assert read_header(run.summary, run.events) is None
    assert read_events(run.events, summary=True) == read_events(run.events)


def test_the_last_events_of_a_long_run_come_from_its_end_without_parsing_its_steps(tmp_path, monkeypatch):
    """`RunDir.last_events` (model card, export, Continue, the Runs page) on a run of two segments without a summary,
    read backwards in small blocks: the same events as a whole read, a hostile line passed over, and only the lines
    of the events asked for parsed (issue #72: 32 CPU s at 10^6 steps when every line was)."""
    from trainer.core import events as events_module

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    writer = EventWriter(run.events)
    writer.emit("run_start", config={"model": {"name": "first"}}, start_step=0)
    emit_steps(writer, 1, 1500)
    writer.emit("run_end", status="stopped")
    writer.emit("run_start", config={"model": {"name": "second"}}, start_step=1500)
    emit_steps(writer, 1501, 3000)
    writer.emit("test", top1=0.9)
    writer.close()
    summary_module.summary_path(run.events).unlink(missing_ok=True)  # a run without one: the slow case
    with open(run.events, "a") as f:
        f.write('{"event": "test", "top1": 0.' + "9" * 5000)  # a line being written when the file is read
    whole = {e["event"]: e for e in read_events(run.events) if e["event"] in ("run_start", "test", "run_end")}
    parsed = []
    loads = json.loads
    monkeypatch.setattr(events_module.json, "loads", lambda text: parsed.append(text) or loads(text))
    monkeypatch.setattr(events_module, "SCAN_BLOCK", 4096)  # lines cut between blocks, many times
    monkeypatch.setattr(events_module, "MAX_EVENT_LINE", 1000)  # the hostile line is longer than an event can be
    last = run.last_events("run_start", "test", "run_end")
    assert last == whole and last["run_start"]["config"]["model"]["name"] == "second"
    assert len(parsed) <= 4, f"{len(parsed)} lines parsed for 3 events"
    assert run.last_events("export") == {}


def test_a_resume_without_a_summary_holds_a_bounded_memory_and_writes_the_same_summary(tmp_path, monkeypatch):
    """Issue #72: `SummaryKeeper.resume` of a run without a summary kept one position per event until it wrote
    (225,005 at 10^5 steps); pruned as it reads, it holds about what the series keep, and writes the same file."""
    events = tmp_path / "events.jsonl"
    writer = EventWriter(events)
    writer.emit("run_start", config={}, start_step=0)
    emit_steps(writer, 1, 12_000)
    writer.close()
    made = {}
    for slack in (10**9, 500):  # never pruned, then pruned all along
        summary_module.summary_path(events).unlink(missing_ok=True)
        monkeypatch.setattr(summary_module, "PRUNE_SLACK", slack)
        keeper = SummaryKeeper.resume(events)
        held = len(keeper._positions)
        keeper.write()
        made[slack] = (held, summary_module.summary_path(events).read_bytes())
    assert made[500][1] == made[10**9][1], "the same summary, pruned or not"
    kept = sum(len(s.kept()) for s in keeper.series.values())
    assert made[10**9][0] > 12_000 and made[500][0] <= 2 * kept + 500, (made[500][0], kept)



def test_grad_stats_lines_taken_without_parsing_give_the_summary_the_trainer_writes(tmp_path, monkeypatch):
    """`main.py summarize` takes the EventWriter's grad_stats lines without parsing them (their series is their name;
    half the time of a summary built for a run without one): the file it writes is the one the trainer's own keeper
    wrote as the run went, and the one it writes parsing every line; a line only shaped like one is not taken."""
    events = tmp_path / "events.jsonl"
    writer = EventWriter(events)
    writer.emit("run_start", config={}, start_step=0)
    emit_steps(writer, 1, 6_000)
    writer.close()
    kept_live = summary_module.summary_path(events).read_bytes()
    made = []
    for prefix in (summary_module.BY_NAME_ALONE, "\0never"):
        summary_module.summary_path(events).unlink()
        monkeypatch.setattr(summary_module, "BY_NAME_ALONE", prefix)
        SummaryKeeper.resume(events).write()
        made.append(summary_module.summary_path(events).read_bytes())
    assert made[0] == made[1] == kept_live
    with open(events, "a") as f:
        f.write('{"event": "grad_stats", "step": 1\n')  # cut short: no closing brace
    monkeypatch.setattr(summary_module, "BY_NAME_ALONE", '{"event": "grad_stats", ')
    summary_module.summary_path(events).unlink()
    keeper = SummaryKeeper.resume(events)
    assert keeper.count == json.loads(made[0].split(b"\n")[0])["events"], "the cut line is not an event"


def test_a_summary_being_built_is_written_as_it_goes_and_can_be_shown_alone(tmp_path, monkeypatch):
    """Issue #72: `main.py summarize` of a 10^6-step run took ~20 s before the app could show a point. It writes the
    summary of what it has read so far as it goes (each a valid summary of the file's start), the app shows that one
    alone (`EventTail(summary_only=True)`: the file itself is not read), and the finished summary is the one a single
    pass writes."""
    events = tmp_path / "events.jsonl"
    writer = EventWriter(events)
    start(writer)
    emit_steps(writer, 1, 3_000)
    writer.emit("run_end", status="completed", message="", step=3_000)
    writer.close()
    summary = summary_module.summary_path(events)
    summary.unlink()
    whole = SummaryKeeper.resume(events)
    whole.write()
    in_one_pass = summary.read_bytes()
    summary.unlink()

    monkeypatch.setattr(summary_module, "READ_CHUNK", 64 << 10)
    written: list[tuple[int, int]] = []  # (offset covered, steps the app would show) at each write on the way
    write = SummaryKeeper.write

    def write_and_look(keeper) -> None:
        write(keeper)
        tail = EventTail(events, summary_only=True)
        shown = []
        while not tail.at_end:
            shown += tail.read_new()
        assert read_header(summary, events)["offset"] == keeper.offset, "a summary of the file as it is"
        written.append((keeper.offset, sum(e["event"] == "step" for e in shown)))

    monkeypatch.setattr(SummaryKeeper, "write", write_and_look)
    keeper = SummaryKeeper.resume(events, write_every_s=0)
    keeper.write()
    size = events.stat().st_size
    assert len([offset for offset, _ in written if 0 < offset < size]) > 5, written
    assert [offset for offset, _ in written] == sorted(offset for offset, _ in written), "each covers more"
    assert written[0][1] > 0, "the first one written already shows a curve"
    assert written[-1][0] == size and summary.read_bytes() == in_one_pass, "the finished one is a single pass's"


def test_a_resumed_run_without_a_summary_starts_at_once_and_its_summary_is_a_single_pass_s(tmp_path, monkeypatch):
    """Issue #72: `resume` of a run of 10^6 steps without a summary waited ~20 s for its summary to be taken up
    before its first step. The trainer's EventWriter now takes it up on a thread of its own: events are written at once,
    and once it is done they are taken in their order; the summary written at the end is the one a single pass over the
    whole file writes."""
    import threading
    import time

    events = tmp_path / "events.jsonl"
    writer = EventWriter(events)
    start(writer)
    emit_steps(writer, 1, 2_000)
    writer.close()
    summary_module.summary_path(events).unlink()
    with open(events, "a") as f:
        f.write('{"event": "step", "step": 2001, "lo')  # the last run crashed mid-line
    monkeypatch.setattr(summary_module, "BUILD_ABOVE", 1000)  # a "long" file: taken up on its thread
    go_on = threading.Event()
    resume = SummaryKeeper.resume.__func__

    def slow_resume(cls, path, write_every_s=None, until=None):
        assert until is not None and go_on.wait(60), "the writer's own pass, held until the events below are written"
        return resume(cls, path, write_every_s, until)

    monkeypatch.setattr(SummaryKeeper, "resume", classmethod(slow_resume))
    began = time.monotonic()
    writer = EventWriter(events)  # does not wait for the summary
    emit_steps(writer, 2_001, 2_600)
    assert time.monotonic() - began < 30 and not writer.summary.caught_up, "written while the summary is taken up"
    go_on.set()
    writer.emit("run_end", status="completed", message="", step=2_600)
    writer.close()
    caught_up = summary_module.summary_path(events).read_bytes()

    monkeypatch.setattr(SummaryKeeper, "resume", classmethod(resume))
    summary_module.summary_path(events).unlink()
    single = SummaryKeeper.resume(events)
    single.write()
    assert caught_up == summary_module.summary_path(events).read_bytes(), "the same summary as one pass"
    read = [e for e in read_events(events, summary=True) if e["event"] == "step"]
    assert read[-1]["step"] == 2_600 and all(e.get("step") != 2001 or "loss" in e for e in read), "the cut line skipped"


def test_the_last_events_of_a_run_with_a_summary_are_not_looked_for_below_what_it_covers(tmp_path):
    """Issue #72: an export of a run whose first segment was 10^6 steps long scanned the whole file backwards for its
    run_start (7-10 s). With a summary that describes the file, the scan stops at what the summary covers and the
    summary answers for the rest: the same events, and a line below that point is never looked at (here one is
    made a run_start of another model: a scan that went down to it would answer with it)."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    writer = EventWriter(run.events)
    writer.emit("run_start", config={"model": {"name": "first"}}, start_step=0)
    emit_steps(writer, 1, 6000)
    writer.emit("run_end", status="stopped")
    writer.close()  # the summary covers all of it
    writer = EventWriter(run.events)
    emit_steps(writer, 6001, 6100)  # a second segment under way: after what the summary covers
    whole = {e["event"]: e for e in read_events(run.events) if e["event"] in ("run_start", "run_end")}
    covered = summary_module.read_header(summary_module.summary_path(run.events), run.events)["offset"]
    data = run.events.read_bytes()
    middle = data.index(b'{"event": "step"', covered // 2)
    line = data[middle:data.index(b"\n", middle)]
    planted = b'{"event": "run_start", "config": {"model": {"name": "below"}}, "x": "'
    planted += b"x" * (len(line) - len(planted) - 2) + b'"}'
    assert len(planted) == len(line) and middle > summary_module.HEAD_BYTES
    with open(run.events, "r+b") as f:
        f.seek(middle)
        f.write(planted)
    assert summary_module.read_header(summary_module.summary_path(run.events), run.events), "the summary still holds"
    last = run.last_events("run_start", "run_end")
    assert last == whole and last["run_start"]["config"]["model"]["name"] == "first"
    writer.close()

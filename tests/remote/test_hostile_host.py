"""A host is not trusted (issue #32): what a broken or compromised host sends is checked in trainer/remote/protocol.py before
anything is written here. In-process where the transport does not matter: the frames, names and streams a hostile
agent would send, fed to the mirror's own code; nothing outside the mirror changes, and the user gets one line."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import yaml

from trainer.core.rundir import RunDir
from trainer.remote import mirror as mirror_module
from trainer.remote import protocol
from trainer.remote.agent import Follower
from trainer.remote.hosts import HostError, load_hosts
from trainer.remote.mirror import Mirror, create_mirror, fetch, fetch_images
from trainer.remote.protocol import FrameError, file_frame, read_frame


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A mirror of a run on host `h` (never reached: the frames are fed in-process) and a file outside it."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"h": {"ssh": "h.invalid", "command": "traindeck", "runs": "/r"}}}))
    monkeypatch.setenv("TRAINDECK_HOSTS", str(hosts))
    from trainer.remote.hosts import get_host

    run = create_mirror(RunDir(tmp_path / "runs" / "remote" / "h" / "run"), get_host("h"), "/r/run")
    outside = tmp_path / "bashrc"
    outside.write_text("mine\n")
    return Mirror(run), outside


def feed(m: Mirror, frame: dict) -> bool:
    """A frame as it travels: one JSON line, read and checked by the protocol, then applied."""
    return m.apply(read_frame(json.dumps(frame).encode() + b"\n"))


@pytest.mark.parametrize("name", ["../../../../bashrc", "/etc/passwd", "eval/../../../../bashrc", "eval/x/../../a",
                                  "checkpoints/last.pt", "eval/val/metrics.json/../../../x", ""])
def test_no_frame_writes_outside_the_mirror_or_outside_the_protocol_s_names(mirror, name, tmp_path):
    m, outside = mirror
    before = sorted(p for p in tmp_path.rglob("*"))
    for frame in ({"t": "file", "file": name, "b64": protocol.encode(b"pwned\n")},
                  {"t": "append", "file": name, "offset": 0, "b64": protocol.encode(b"pwned\n")},
                  {"t": "truncate", "file": name}):
        with pytest.raises(FrameError):
            feed(m, frame)
    assert outside.read_text() == "mine\n"
    assert sorted(p for p in tmp_path.rglob("*")) == before, "nothing made anywhere"


def test_a_link_placed_in_the_mirror_is_never_written_through(mirror):
    m, outside = mirror
    (m.run.path / "eval").mkdir()
    (m.run.path / "eval" / "val").symlink_to(outside.parent)
    with pytest.raises(FrameError, match="is a link"):
        feed(m, file_frame("eval/val/metrics.json", b"{}"))
    assert not (outside.parent / "metrics.json").exists()


@pytest.mark.parametrize("frame, said", [
    ([1, 2], "not an object"), (42, "not an object"), (None, "not an object"),
    ({"t": "append", "file": "train.log", "offset": "12abc", "b64": ""}, "is not a byte count"),
    ({"t": "append", "file": "train.log", "offset": -5, "b64": ""}, "is not a byte count"),
    ({"t": "append", "file": "train.log", "offset": 0}, "no data"),
    ({"t": "file", "file": "status.json", "b64": "***"}, "not base64"),
    ({"t": "job", "job": "x"}, "needs job"),
    ({"t": "rm -rf"}, "unknown kind"),
])
def test_malformed_frames_are_named_not_a_traceback(mirror, frame, said):
    m, _ = mirror
    with pytest.raises(FrameError, match=said):
        feed(m, frame)


def test_a_status_json_that_is_not_an_object_is_refused(mirror):
    m, _ = mirror
    for data in (b"[1, 2]", b'"running"', b"\xff\xfe"):
        with pytest.raises(FrameError, match="not a JSON object"):
            feed(m, file_frame("status.json", data))


def test_a_huge_frame_line_is_refused_without_reading_it_whole(monkeypatch):
    stream = io.BytesIO(b"x" * 10_000_000 + b"\n")
    with pytest.raises(FrameError, match="longer than"):
        protocol.read_line(stream, 1_000, "follow")
    assert stream.tell() <= 1_001, "the rest of the line stays unread"


def test_a_non_utf8_log_is_mirrored_byte_for_byte(mirror, tmp_path):
    """One latin-1 byte in train.log: the agent decoded with errors=replace, the byte count changed and the next
    line lost its first bytes."""
    m, _ = mirror
    host_run = RunDir(tmp_path / "host" / "run").create()
    first = "température 42\n".encode("latin-1") + b"line two\n"
    host_run.log.write_bytes(first)
    follower = Follower(str(host_run.path), {}, None, None)
    for frame in follower._append_frames():
        feed(m, frame)
    with open(host_run.log, "ab") as f:
        f.write(b"line three \xe9\xff\n")
    for frame in Follower(str(host_run.path), m.offsets(), None, None)._append_frames():
        feed(m, frame)
    assert (m.run.path / "train.log").read_bytes() == host_run.log.read_bytes()


def test_a_run_deleted_on_the_host_ends_the_follower_with_its_reason(mirror, tmp_path, capsys):
    m, _ = mirror
    Follower(str(tmp_path / "host" / "gone"), {}, None, None).follow()
    frames = [read_frame(line.encode()) for line in capsys.readouterr().out.splitlines()]
    assert [f["t"] for f in frames] == ["gone"]
    assert m.apply(frames[0]) is True, "the follower ends"
    status = m.run.read_status()
    assert status["state"] == "failed" and "not on the host" in status["message"]


def test_fetch_takes_only_a_checkpoint_or_an_export_inside_the_mirror(mirror, tmp_path):
    m, outside = mirror
    for name in ("../x", "../../../../bashrc", "/etc/passwd", "checkpoints/../../x", "-- --kill", "events.jsonl",
                 "exports/../../x"):
        with pytest.raises(HostError, match="only a file under checkpoints/ or exports/"):
            fetch(m.run, name)
    assert outside.read_text() == "mine\n" and not (tmp_path / "runs" / "remote" / "h" / "x").exists()


def test_a_send_header_that_is_not_a_size_is_refused():
    for header in (b"12abc\n", b"-5\n", b"9" * 30 + b"\n", b"Welcome to lab\n"):
        with pytest.raises(FrameError, match="not a size"):
            protocol.parse_size_header(header, "send")
    assert protocol.parse_size_header(b"1234\n", "send") == 1234


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return out.getvalue()


def test_gallery_tar_members_go_only_where_asked_bounded_and_streamed(mirror, tmp_path, monkeypatch):
    m, outside = mirror
    stream = _tar({"data/cat/a.png": b"A" * 100, "../../../../bashrc": b"pwned", "data/cat/huge.png": b"B" * 5000,
                   "data/cat/extra.png": b"C"}, links={"data/cat/link.png": str(outside)})
    host_side = tmp_path / "tar"
    host_side.write_bytes(stream)
    monkeypatch.setattr(protocol, "MAX_IMAGE_BYTES", 1000)
    monkeypatch.setattr(mirror_module, "MAX_IMAGE_BYTES", 1000)
    monkeypatch.setattr("trainer.remote.ssh.connect", lambda host: None)
    monkeypatch.setattr("trainer.remote.ssh.command_argv",
                        lambda host, args: ["sh", "-c", 'cat >/dev/null; cat "$0"', str(host_side)])
    count = fetch_images(m.run, ["/data/cat/a.png", "../../../../bashrc", "/data/cat/huge.png", "/data/cat/link.png"])
    files = m.run.path / mirror_module.FILES
    assert count == 1 and (files / "data" / "cat" / "a.png").read_bytes() == b"A" * 100
    assert not (files / "data" / "cat" / "huge.png").exists(), "over the limit: skipped, never held in memory"
    assert not (files / "data" / "cat" / "extra.png").exists(), "not asked for"
    assert not (files / "data" / "cat" / "link.png").exists() and outside.read_text() == "mine\n"


def test_a_shell_banner_before_the_answer_is_named(monkeypatch):
    with pytest.raises(FrameError, match=r"the host's shell printed something before TrainDeck's answer \('Welcome'\)"):
        protocol.parse_answer(b"Welcome\n" + json.dumps({"traindeck": "1"}).encode(), "lab: `agent version`")
    with pytest.raises(FrameError, match="not an object"):
        protocol.parse_answer(b"42", "lab: `agent version`")
    with pytest.raises(FrameError, match="more than"):
        protocol.parse_answer(b"x" * (protocol.MAX_ANSWER_BYTES + 1), "lab: `agent version`")


# nested aliases: a repr of `c` would be 9**12 entries long (the message used to format it whole)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, n in zip("abcdefghijk", "bcdefghijkl")
) + "hosts: {lab: {ssh: lab, scheduler: *l}}\n"


@pytest.mark.parametrize("text, said", [
    (BOMB, r"hosts.lab.scheduler: \[\[\[\.\.\.\], \[\.\.\.\]"),
    (b"hosts:\n  lab: {ssh: caf\xe9}\n", "not UTF-8"),
    ("- lab\n- other\n", "expected a mapping with `hosts:`"),
    ("hosts:\n  ~: {ssh: lab}\n", "host name None"),
    ("hosts:\n  true: {ssh: lab}\n", "host name True"),
    ("hosts:\n  lab: {ssh: '-oProxyCommand=touch /tmp/pwned'}\n", "starts with '-'"),
])
def test_a_hosts_file_that_is_hostile_or_wrong_is_one_line(tmp_path, text, said):
    path = tmp_path / "hosts.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(HostError, match=said) as caught:
        load_hosts(path)
    assert len(str(caught.value)) < 600, "the expanded value is never formatted into the message"


def test_the_ssh_destination_follows_an_end_of_options():
    from trainer.remote.hosts import Host
    from trainer.remote.ssh import ssh_argv

    argv = ssh_argv(Host(name="lab", ssh="lab.example.org"))
    assert argv[-2:] == ["--", "lab.example.org"]


def test_a_host_s_exit_code_outside_the_trainer_s_is_a_failure_not_a_wrapped_number(mirror):
    m, _ = mirror
    m.run.write_status(state="failed", exit_code=259)  # 259 & 0xFF would read as 3, "diverged", here
    assert m.exit_code() == 1
    m.run.write_status(state="failed", exit_code=2)
    assert m.exit_code() == 2


def test_a_remote_export_checks_its_out_here_before_the_host_is_asked(mirror, tmp_path):
    from trainer.core.errors import InputError
    from trainer.remote.remote_cli import remote_export
    from trainer.runs.commands import Export

    m, _ = mirror
    mine = tmp_path / "model.onnx"
    mine.write_text("the user's own file\n")
    with pytest.raises(InputError, match="exists and is not a onnx export"):
        remote_export(m.run, Export(run_dir=str(m.run.path), format="onnx", out=str(mine)), mine)  # host not reached
    (tmp_path / "other.onnx.md").mkdir()
    with pytest.raises(InputError, match="where the model card goes"):
        remote_export(m.run, Export(run_dir=str(m.run.path), format="onnx", out=str(tmp_path / "other.onnx")),
                      tmp_path / "other.onnx")
    assert mine.read_text() == "the user's own file\n" and not (m.run.path / "exports").exists()


def test_a_predictions_csv_from_the_host_without_its_columns_or_numbers_is_passed_over(mirror):
    from trainer.remote.mirror import gallery_paths

    m, _ = mirror
    (m.run.path / "eval" / "val").mkdir(parents=True)
    (m.run.path / "eval" / "val" / "predictions.csv").write_text(
        "path,true,predicted,loss\n/a.png,cat,dog,0.5\n/b.png,cat,dog,lots\n/c.png,cat,dog,nan\n/d.png,cat,cat,9\n")
    (m.run.path / "eval" / "test").mkdir()
    (m.run.path / "eval" / "test" / "predictions.csv").write_text("only,other,columns\n1,2,3\n")
    assert gallery_paths(m.run) == ["/a.png"]


def test_a_follower_fed_malformed_frames_gives_up_with_one_line(mirror, monkeypatch):
    """A frame with a non-numeric offset made the follower reconnect every second for ever (649 ssh connections in
    15 minutes)."""
    m, _ = mirror
    bad = json.dumps({"t": "append", "file": "train.log", "offset": "12abc", "b64": ""})
    monkeypatch.setattr("trainer.remote.ssh.connect", lambda host: None)
    monkeypatch.setattr(m, "follow_argv", lambda: ["sh", "-c", f"echo '{bad}'"])
    monkeypatch.setattr(m, "_sleep", lambda seconds: None)  # the retry waits, skipped
    m.out = io.StringIO()  # mirror.log
    with pytest.raises(HostError, match="gave up following .* 3 times"):
        m.follow()
    assert m.reconnects == 2 and m.out.getvalue().count("malformed frame from h") == 3


GOOD_LISTING = {"path": "/data", "parent": "/", "entries": [{"name": "cats", "folders": 0, "images": 3}]}


@pytest.mark.parametrize("change, said", [
    ({"entries": [{"name": "../../etc", "folders": 0, "images": 1}]}, "not a folder name: '../../etc'"),
    ({"entries": [{"name": "a/b", "folders": 0, "images": 1}]}, "not a folder name"),
    ({"entries": [{"name": "x", "folders": "many", "images": 1}]}, r"entries\[0\]\.folders: expected int"),
    ({"entries": [{"name": "x", "folders": 0}]}, r"entries\[0\]: no images"),
    ({"path": ["/"]}, "path: expected str"),
    ({"entries": [{"name": "x", "folders": 0, "images": 0}] * 1001}, "more than 1000 folders"),
    ({"extra": 1}, "unknown field 'extra'"),
    ({"files": ["../labels.csv"]}, r"files\[0\]: not a file name: '../labels.csv'"),
    ({"files": ["x.csv"] * 1001}, "more than 1000 files"),
])
def test_a_folder_listing_from_the_host_is_checked_before_the_browser_sees_it(change, said):
    assert protocol.listing_answer(GOOD_LISTING, "lab: `agent ls`") == {**GOOD_LISTING, "files": []}  # an older host
    with_files = {**GOOD_LISTING, "files": ["labels.csv"]}
    assert protocol.listing_answer(with_files, "lab: `agent ls`") == with_files
    with pytest.raises(FrameError, match=said):
        protocol.listing_answer({**GOOD_LISTING, **change}, "lab: `agent ls`")


def test_a_scan_from_the_host_becomes_a_scan_result_or_one_line():
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 10
    good = {"result": {"root": "/data", "classes": ["a", "b"], "samples": [["/data/a/1.png", 0]],
                       "bad_files": [["/data/b/x.png", "truncated"]], "image_sizes": [[32, 24]]},
            "thumbs": [["a", protocol.encode(png)]]}
    result, thumbs = protocol.read_scan(json.dumps(good), "lab: `agent scan`")
    assert result.classes == ["a", "b"] and result.samples == [("/data/a/1.png", 0)]
    assert result.image_sizes == [(32, 24)] and result.counts == {"a": 1, "b": 0} and thumbs == [("a", png)]
    labelled = {"root": "/data", "classes": ["a", "b"], "samples": [["/data/1.png", [1, 1]], ["/data/2.png", [0, 1]]],
                "labels_file": "/data/labels.csv", "pairs": [["a", "b", 1]]}
    result, _ = protocol.read_scan(json.dumps(dict(good, result=labelled)), "lab: `agent scan`")
    assert result.samples[0] == ("/data/1.png", (1, 1)) and result.counts == {"a": 1, "b": 2}  # multi-label
    for bad, said in ((dict(good, result={**good["result"], "samples": [["/x", "zero"]]}), r"samples\[0\]\[1\]"),
                      (dict(good, result={**good["result"], "samples": [["/x", 2]]}), r"samples\[0\]: not a label"),
                      (dict(good, result={**labelled, "samples": [["/x", [1]]]}), r"samples\[0\]: not a label"),
                      (dict(good, result={**labelled, "samples": [["/x", [1, 7]]]}), r"samples\[0\]: not a label"),
                      (dict(good, result={**good["result"], "evil": 1}), "unknown field 'evil'"),
                      (dict(good, result={"classes": ["a"]}), r"result: no root"),
                      (dict(good, thumbs=[["a", "not base64!"]]), r"thumbs\[0\]: its data is not base64"),
                      (dict(good, thumbs=[["a", "A" * (2 << 20)]]), "more than 1048576 bytes"),
                      ([], "expected an object")):
        with pytest.raises(FrameError, match=said):
            protocol.read_scan(json.dumps(bad), "lab: `agent scan`")


def test_a_plan_from_the_host_is_checked_field_by_field():
    import typing

    from trainer.auto import Choice, Measured

    assert protocol.PROBE_FIELDS == typing.get_type_hints(Measured), "the protocol declares Auto's probes as they are"
    assert protocol.CHOICE_FIELDS.keys() == typing.get_type_hints(Choice).keys()
    probe = {"model": "small_cnn", "weights": None, "size": 32, "batch": 64, "train_images_per_s": 480.5,
             "eval_images_per_s": 2000, "epoch_s": 0.4, "epochs": 12, "how": "measured", "finish_s": 3.5}
    good = {"config": {"model": {"name": "small_cnn"}}, "choices": [{"key": "model.name", "value": "small_cnn",
                                                                      "why": "fast"}],
            "probes": [probe], "planning_s": 4.2, "offer": None}
    offer = {"model": "resnet18", "weights": "IMAGENET1K_V1", "file": "/c/resnet18.pth", "url": "https://x/r.pth",
             "megabytes": 44.7, "why": "photographs"}
    assert protocol.plan_answer(dict(good, offer=offer), "lab")["offer"] == offer
    assert protocol.plan_answer(good, "lab: `auto --plan-only`") == good
    for bad, said in ((dict(good, choices=[{"key": "x", "value": 1}]), r"choices\[0\]: no why"),
                      (dict(good, probes=[dict(probe, weights=3)]), r"probes\[0\]\.weights: expected str or NoneType"),
                      (dict(good, probes=[dict(probe, epochs=True)]), r"probes\[0\]\.epochs: expected int"),
                      (dict(good, planning_s="soon"), "planning_s: expected float"),
                      (dict(good, config=[]), "config: expected dict"),
                      (dict(good, offer=dict(offer, run="net.py")), "offer: unknown field 'run'")):
        with pytest.raises(FrameError, match=said):
            protocol.plan_answer(bad, "lab: `auto --plan-only`")

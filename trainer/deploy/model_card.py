"""The model card written beside every export: `<file>.json` (what `predict` and other programs read) and `<file>.md`
(what people read). Torch-free: the app reads the JSON to show an export's numbers.

The JSON keeps the sidecar's keys (format, model_name, classes, image_size, image_width, fit, mean, std, resize, source_run,
checkpoint, epoch, best_acc, tta) and adds: `card_version`, `file` (name, bytes), `metrics` (top-1, the checkpoint's
top-1 and their agreement, with the split and image count), `speed` (latency and throughput, the runtime and the
machine), `conversion` (int8/fp16: how), `checked` (how the file was loaded back), `not_measured` (what could not
be, and why), `training` (the config and data counts) and `load` (three-line snippets per consumer).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from trainer.core.catalog import EXPORT_DESCRIPTIONS, EXPORT_FORMATS, EXPORT_REGISTRY

CARD_VERSION = 1


def card_path(export: Path) -> Path:
    """The Markdown card of an export (the JSON one is `<file>.json`, the sidecar `predict` reads)."""
    return Path(f"{export}.md")


def read_card(export: Path) -> dict | None:
    """An export's JSON card, or None when it has none (or not a readable one)."""
    try:
        card = json.loads(Path(f"{export}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) and "format" in card else None


def out_problem(fmt: str, out: Path) -> str | None:
    """What `--out` may replace: nothing, or an export of the same format (its card says so; a Core ML package or an
    OpenVINO IR is a folder with its Manifest.json or model.xml). A user's other file or folder is refused, never
    deleted or overwritten, and so is an out whose card names (`OUT.json`, `OUT.md`) are folders: nothing is
    half-written. The message, or None.
    (Torch-free: an export of a remote run is checked here before the host is asked.)"""
    marker = EXPORT_REGISTRY[fmt].folder  # an export that is a folder (Core ML, OpenVINO): the file that says so
    package = marker is not None and out.name.endswith(EXPORT_FORMATS[fmt])
    if out.is_dir() and not package:
        return f"--out: {out} is a folder; give a file name, such as {out / ('model' + EXPORT_FORMATS[fmt])}"
    if out.exists() or out.is_symlink():
        card = read_card(out)
        same = card is not None and card.get("format") == fmt and not out.is_symlink()
        if package and out.is_dir():
            same = same and (out / marker).is_file()
        if not same:
            return (f"--out: {out} exists and is not a {fmt} export of TrainDeck's (no model card of that format "
                    f"beside it); it is left as it is: choose another name")
    for suffix in (".json", ".md"):
        beside = Path(f"{out}{suffix}")
        if beside.is_dir() or beside.is_symlink():
            return f"--out: {beside} (where the model card goes) is a folder or a link; choose another name"
        if beside.exists() and not out.exists():  # no export there: the file beside it is the user's own
            return (f"--out: {beside} exists (where the model card would go) with no export beside it; it is left "
                    f"as it is: choose another name")
    return None


def _group_lines(groups: list[dict]) -> list[str]:
    """The optimizer's parameter groups as one card line (none: every parameter at the optimizer's lr)."""
    if not groups:
        return []
    described = [f"{md_code(str(g.get('name') or g.get('pattern')))} "
                 + ", ".join("frozen" if k == "freeze" else f"{k} {v}" for k, v in g.items()
                             if k not in ("name", "pattern") and v not in (None, False))
                 for g in groups]
    return ["- parameter groups: " + "; ".join(described) + "; the other parameters at the optimizer's lr"]


def load_snippets(fmt: str, name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    """Consumer -> the lines that load the file `name` and classify `x` (float32, (N, 3, height, width), normalised):
    the format's own (trainer/deploy/formats/)."""
    from trainer.deploy import formats  # its modules import torch only inside their functions

    snippets = formats.part(fmt, "snippets")
    return snippets(name, model_name, classes, shape) if snippets else {}


def summary(card: dict) -> str:
    """One line: size, top-1 with its split, agreement, speed (or why they were not measured)."""
    parts = [format_size(card["file"]["bytes"])]
    m, s = card.get("metrics"), card.get("speed")
    if m:
        what, key = quality(m)
        parts.append(f"{what} {format_percent(m[key])} on the {m['split']} split ({m['images']} images; the checkpoint "
                     f"{format_percent(m['checkpoint_' + key])}, agreement {format_percent(m['agreement'])})")
    if s:
        parts.append(f"{s['batch1_ms']:.2f} ms per image, {s['images_per_s']:.0f} images/s at batch {s['batch']} "
                     f"({s['runtime']})")
    parts += [f"{what} not measured: {why}" for what, why in card.get("not_measured", {}).items()]
    return "; ".join(parts)


def quality(metrics: dict) -> tuple[str, str]:
    """(what the card measured an export by, its key): top-1, or a multi-label export's mAP."""
    return ("mAP", "map") if "map" in metrics else ("top-1", "top1")


def format_percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def format_size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|>~])")


def plain(text) -> str:
    """One line of text: control characters (a newline too) shown as escapes, never acted on."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def md(text) -> str:
    """User-given text (a class name, a path) as Markdown that shows it and nothing else: no HTML, no link, no
    heading or code block of its own."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(plain(text), quote=False))


def md_code(text) -> str:
    """User-given text as an inline code span (HTML and Markdown inside one are shown, not run)."""
    text = plain(text).replace("`", "'")
    return f"`{text}`"


def markdown(card: dict) -> str:
    """The card as Markdown, for people."""
    name = card["file"]["name"]
    multilabel = card.get("task") == "multilabel"
    kind = "labels" if multilabel else "classes"
    height, width = card["image_size"], card.get("image_width") or card["image_size"]
    lines = [f"# {md(name)}: {md(card['model_name'])}, {len(card['classes'])} {kind}", "",
             f"{EXPORT_DESCRIPTIONS.get(card['format'], card['format'])}.", "",
             f"Exported by TrainDeck {card['traindeck']} on {card['created']} from the run {md_code(card['source_run'])} "
             f"({md_code(Path(card['checkpoint']).name)}, epoch {card['epoch']}).", "", "## Measured", ""]
    m, s = card.get("metrics") or {}, card.get("speed")
    latency = f"{s['batch1_ms']:.2f} ms" if s else "—"
    throughput = f"{s['images_per_s']:.0f} images/s at batch {s['batch']}" if s else "—"
    what, key = quality(m)
    lines += [f"| file size | {what} | checkpoint {what} | agreement | latency, batch 1 | throughput |",
              "|---|---|---|---|---|---|",
              f"| {format_size(card['file']['bytes'])} | {format_percent(m.get(key))} "
              f"| {format_percent(m.get('checkpoint_' + key))} "
              f"| {format_percent(m.get('agreement'))} | {latency} | {throughput} |", ""]
    agreement = ("the share of image-label decisions (at each label's threshold) the same as the checkpoint's"
                 if key == "map" else "the share of images given its class")
    if m:
        lines += [f"{what} on the run's {m['split']} split ({m['images']} images"
                  + (f" of {m['of']}" if m["of"] > m["images"] else "") + f", listed in {md_code(m['source'])}); "
                  + ("the checkpoint's classes are the run's own evaluation in that file (what the Results tab "
                     "shows)" if m.get("checkpoint_from") == m["source"] else
                     "the checkpoint is the exported network in fp32") + f", agreement is {agreement}.", ""]
    if card.get("thresholds"):
        lines += ["Multi-label: the outputs are logits, one per label; a label's probability is its sigmoid, and the "
                  "label is on at its threshold (chosen on the validation split for the best F1): "
                  + ", ".join(f"{md(n)} {t:.3f}" for n, t in zip(card["classes"], card["thresholds"])) + ".", ""]
    if s:
        ref = s.get("checkpoint")
        harness = s.get("harness")
        lines += [f"Speed: {s['runtime']}, on {s['machine']}"
                  + (f"; the checkpoint in PyTorch fp32: {ref['batch1_ms']:.2f} ms, {ref['images_per_s']:.0f} images/s"
                     if ref else "")
                  + (f" (one harness for both: the same {s['batch']} images, {harness['threads']} threads, "
                     f"{harness['warm_up'][0]} warm-up runs, their runs alternated)" if harness and ref else "")
                  + ".", ""]
    for what, why in card.get("not_measured", {}).items():
        lines += [f"Not measured: {what}: {why}.", ""]
    if card.get("checked"):
        lines += [f"Checked: {card['checked']}.", ""]
    if card.get("conversion"):
        lines += ["## Conversion", ""] + [f"- {k.replace('_', ' ')}: {v}" for k, v in card["conversion"].items()] + [""]
    lines += ["## Input", "",
              f"- RGB image, {card['resize']} ({width} pixels wide, {height} high)",
              "- scaled to 0..1, then normalised per channel: (x - mean) / std with "
              f"mean {card['mean']} and std {card['std']}",
              f"- tensor layout N x 3 x {height} x {width} (height, width), float32, named `images`; "
              f"output `logits`, N x {len(card['classes'])} "
              f"({'sigmoid per label' if multilabel else 'softmax'} for probabilities)"]
    if card.get("tta"):
        lines.append("- flip test-time augmentation: " + ("inside the file" if card["tta"] == "graph" else
                                                            "average the logits of the image and its mirror image"))
    lines += ["", f"## {kind.capitalize()}", "", f"Output index: {'label' if multilabel else 'class'}.", ""]
    lines += [f"{i}. {md(c)}" for i, c in enumerate(card["classes"])]
    lines += ["", "## Load it", ""]
    for consumer, code in card["load"].items():
        lang = "python" if "Python" in consumer else ("csharp" if "C#" in consumer else
                                                      "kotlin" if "Kotlin" in consumer else
                                                      "swift" if "Swift" in consumer else "cpp")
        lines += [f"{consumer}:", "", f"```{lang}", code, "```", ""]
    t = card["training"]
    checkpoint = t.get("checkpoint_epoch", t["epochs_trained"])
    lines += ["## Training", "", f"- run: {md_code(t['run'])}, {t['epochs_trained']} epochs trained"
              + (f", the weights of epoch {checkpoint}" if checkpoint != t["epochs_trained"] else "")
              + (f", best validation accuracy {format_percent(card['best_acc'])}" if card.get("best_acc") is not None
                 else ""),
              f"- data: {md_code(t['config']['data']['train_dir'])}: {t['data'].get('train_images', '?')} training, "
              f"{t['data'].get('val_images', '?')} validation"
              + (f", {t['data']['test_images']} test" if t["data"].get("test_images") else "") + " images",
              f"- model {md_code(card['model_name'])}" + (f", weights {md(t['weights'])}" if t.get("weights")
                                                     else ", from scratch")
              + f"; optimizer {t['config']['optimizer']['name']} at lr {t['config']['optimizer'].get('lr')}, "
              f"precision {t.get('precision', '?')}",
              *_group_lines(t["config"]["optimizer"].get("groups") or []),
              "", "The whole training config is in the JSON card (`training.config`).", ""]
    return "\n".join(lines)

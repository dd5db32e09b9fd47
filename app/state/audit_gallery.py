"""What the Results tab's gallery shows of `main.py audit --json` (issue #35): the label issues, the copies and the
outliers (far from every other image, then the ones the network is unsure of), each as the gallery's images with a
title and what the audit measured of each; a multi-label run's too (issue #49). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from app.state.eval_results import Prediction

KEYS = "E exclude · R relabel as suggested · K keep"


BELOW_THE_LINE = "below the line"  # an audit's suspect past the flagged ones: among the least confident of the rest


def audit_gallery(report: dict, kind: str) -> tuple[list[Prediction], str]:
    """(the images, the gallery's title) of the audit's `kind`: "suspects", "copies" or "outliers"."""
    if kind == "outliers":
        found = [Prediction(o["path"], o["label"], o["suggested"], o["distance"], 0.0, audit="outlier")
                 if o.get("why", "far") == "far" else
                 Prediction(o["path"], o["label"], o["suggested"], o["top"], 0.0, audit="unsure")
                 for o in report["outliers"]]
        far = sum(p.audit == "outlier" for p in found)
        return found, (f"{far} of {report['images']} images far from every other, farthest first; then "
                       f"{len(found) - far} the network is unsure of, least sure first ({KEYS})")
    if kind == "copies":
        found = copies(report["duplicates"])
        leaks = sum(p.copy_of[0] != "train" for p in found)
        worth = f"<br>{report['leak_worth'][0].upper()}{report['leak_worth'][1:]}." if report.get("leak_worth") else ""
        return found, (f"{len(found)} copies of another image ({leaks} of a test or validation image: a leak), most "
                       f"alike first; left the copy, right the image it copies (E exclude the copy · K keep){worth}")
    found = [Prediction(s["path"], s["given"], s["suggested"], s["score"], 0.0,
                        audit="issue" if s.get("flagged", True) else BELOW_THE_LINE) for s in report["suspects"]]
    flagged = sum(s.get("flagged", True) for s in report["suspects"])
    below = f"; then {len(found) - flagged} below the line, the least confident of the rest" if len(found) > flagged \
        else ""
    return found, (f"{flagged} of {report['images']} images probably labelled wrong, most likely first{below} "
                   f"({KEYS})")


def copies(groups: list[dict]) -> list[Prediction]:
    """Each copy an exclusion could take out of training, beside the image it copies: in a leak the training
    images copy the test or validation one (which stays, to score the run); else the first of the group stays.
    `predicted` is that image's label (relabelling to it fixes a copy filed under another class)."""
    out = []
    for g in groups:
        images = g["images"]
        kept = images[0]
        if g["leak"]:
            kept = min(images, key=lambda i: ("test", "val", "train").index(i["split"]))
        for image in images:
            if image is not kept and image["split"] == "train":
                out.append(Prediction(image["path"], image["label"], kept["label"], g["similarity"], 0.0,
                                      audit="near copy" if g["near"] else "exact copy",
                                      copy_of=(kept["split"], kept["path"])))
    return out


def audit_measure(p: Prediction) -> str:
    """What the audit measured of an image it listed."""
    if p.audit == "outlier":
        return f"mean cosine distance {p.confidence:.3f} to its nearest images"
    if p.audit == "unsure":
        return f"the network gives no class even odds (its most probable at {p.confidence:.0%})"
    if p.audit == "map":
        return f"chosen on the map; the cross-fitted probe says {p.predicted}"
    if p.copy_of:
        what = "a resized or recompressed copy" if p.audit == "near copy" else "a byte-identical copy"
        split, path = p.copy_of
        return f"{what} of the {split} image {path} (thumbnails' correlation {p.confidence:.4f})"
    below = " (below the line: confident learning did not flag it)" if p.audit == BELOW_THE_LINE else ""
    return f"the given label's probability, out of sample: {100 * p.confidence:.2g}%{below}"


def score_text(p: Prediction) -> str:
    """The number under an audited image's thumbnail."""
    if p.audit == "outlier":
        return f"{p.confidence:.3f}"
    if p.audit == "unsure":
        return f"{p.confidence:.0%}"
    if p.copy_of:
        return "leak" if p.copy_of[0] != "train" else "copy"
    if p.audit == "map":
        return ""
    return f"{100 * p.confidence:.2g}%"  # an issue: the given label's probability, often tiny


@dataclass
class Listed:
    """An image the audit of a multi-label run lists: its label set, the set suggested for it, the caption under its
    thumbnail and what the audit measured of it."""
    path: str
    given: str  # its labels (`3;7`; empty for none)
    suggested: str  # the probe's set (a label issue), the network's at the thresholds (an outlier), the copied image's
    caption: str
    measure: str
    copy_of: str | None = None  # a copy: the image it copies


def change_text(suspect: dict) -> str:
    """What the audit suggests for an image: `+3 −8` (add 3, remove 8), most likely first."""
    return " ".join([f"+{n}" for n in suspect["add"].split(";") if n] +
                    [f"\u2212{n}" for n in suspect["remove"].split(";") if n])


def multilabel_gallery(report: dict, kind: str) -> tuple[list[Listed], str]:
    """(the images, the gallery's title) of a multi-label run's audit: its `kind`, "suspects", "outliers" or
    "copies"."""
    keys = "R relabel as suggested · E exclude · K keep"
    if kind == "outliers":
        found = [Listed(o["path"], o["label"], o["suggested"], f"{o['distance']:.3f}",
                        f"mean cosine distance {o['distance']:.3f} to its nearest images")
                 if o.get("why", "far") == "far" else
                 Listed(o["path"], o["label"], o["suggested"], f"{o['about']} {o['top']:.0%}",
                        f"the network gives {o['about']} {o['top']:.1%}, next to its threshold")
                 for o in report["outliers"]]
        far = sum(o.get("why", "far") == "far" for o in report["outliers"])
        return found, (f"<b>Outliers</b>: {far} of {report['images']} images far from every other, farthest first; "
                       f"then {len(found) - far} with a label the network is undecided on, nearest its threshold "
                       f"first (suggested: the network's labels at the thresholds; {keys})")
    if kind == "copies":
        listed = copies(report["duplicates"])
        found = [Listed(p.path, p.true, p.predicted, "leak" if p.copy_of[0] != "train" else "copy", audit_measure(p),
                        p.copy_of[1]) for p in listed]
        leaks = sum(p.copy_of[0] != "train" for p in listed)
        worth = f"<br>{report['leak_worth'][0].upper()}{report['leak_worth'][1:]}." if report.get("leak_worth") else ""
        return found, (f"<b>Copies</b>: {len(found)} copies of another image ({leaks} of a test or validation image: a "
                       f"leak), most alike first; left the copy, right the image it copies (E exclude the copy · R "
                       f"give it the labels of the image it copies · K keep){worth}")
    found = [Listed(s["path"], s["given"], s["suggested"], change_text(s),
                    f"its most doubted label's probability out of sample {100 * s['score']:.2g}%")
             for s in report["suspects"]]
    return found, (f"<b>Label issues</b>: {len(found)} of {report['images']} images probably miss a label (+) or carry "
                   f"one they should not (\u2212), most likely first ({keys})")

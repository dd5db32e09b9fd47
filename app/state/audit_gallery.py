"""What the Results tab's gallery shows of `main.py audit --json` (issue #35): the label issues, the copies and the
outliers (far from every other image, then the ones the network is unsure of), each as the gallery's images with a
title and what the audit measured of each. Torch-free."""

from __future__ import annotations

from app.state.eval_results import Prediction

KEYS = "E exclude · R relabel as suggested · K keep"


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
    found = [Prediction(s["path"], s["given"], s["suggested"], s["score"], 0.0, audit="issue")
             for s in report["suspects"]]
    return found, f"{len(found)} of {report['images']} images probably labelled wrong, most likely first ({KEYS})"


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
    return f"the given label's probability, out of sample: {100 * p.confidence:.2g}%"


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

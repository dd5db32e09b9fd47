"""Fine-tuning recipes: what each one sets in a config. Torch-free: the Optimizer page's buttons and the
benchmarks (bench/pretrained.py) both apply them from here.
"""

from __future__ import annotations

import copy

from trainer.core.errors import InputError

FINE_TUNE_BACKBONE_SHARE = 0.1  # the backbone's learning rate as a share of the head's, in the fine-tune recipe

# key -> (label, what it does)
RECIPES = {
    "scratch": ("Every layer alike", "all parameters train at the optimizer's learning rate (parameter groups "
                                     "removed)"),
    "linear_probe": ("Linear probe", "only the classifier head trains; the backbone's weights and BatchNorm "
                                     "statistics stay as loaded (model.freeze_backbone)"),
    "fine_tune": ("Fine-tune", f"the backbone trains at {FINE_TUNE_BACKBONE_SHARE:g}x the head's learning rate, "
                               f"through a parameter group for the head (edit it below)"),
    "gradual": ("Gradual unfreezing", "the backbone stays frozen for the first epoch(s), then trains too "
                                      "(model.unfreeze_at_epoch)"),
}


class RecipeError(InputError, ValueError):
    pass


def apply_recipe(key: str, raw: dict, head: str | None) -> dict:
    """A copy of the config `raw` (a dict; optimizer.lr a number) with recipe `key` applied for a model whose
    classifier head is the module `head`. Applying a recipe twice changes nothing more."""
    if key not in RECIPES:
        raise RecipeError(f"unknown recipe {key!r} (known: {', '.join(RECIPES)})")
    out = copy.deepcopy(raw)
    model, optimizer = out.setdefault("model", {}), out.setdefault("optimizer", {})
    groups = list(optimizer.get("groups") or [])
    head_groups = [g for g in groups if g.get("pattern") == head] if head else []
    others = [g for g in groups if not head or g.get("pattern") != head]
    if key == "scratch":
        model["freeze_backbone"], model["unfreeze_at_epoch"] = False, 0
        optimizer["groups"] = []  # every layer alike: no group of any kind
        if head_groups and head_groups[0].get("lr"):  # undo fine-tune: the head's rate becomes everyone's
            optimizer["lr"] = head_groups[0]["lr"]
    elif key == "linear_probe":
        model["freeze_backbone"], model["unfreeze_at_epoch"] = True, 0
    elif key == "gradual":
        model["freeze_backbone"] = False
        model["unfreeze_at_epoch"] = max(1, int(model.get("unfreeze_at_epoch") or 0))
    elif key == "fine_tune":
        if not head:
            raise RecipeError("fine-tune needs the model's classifier head: choose a model first")
        model["freeze_backbone"], model["unfreeze_at_epoch"] = False, 0
        if not head_groups:
            lr = optimizer.get("lr")
            if not isinstance(lr, (int, float)) or lr <= 0:
                raise RecipeError("set a valid learning rate first: the head gets it, the backbone a share")
            optimizer["groups"] = [{"pattern": head, "lr": lr}, *others]
            optimizer["lr"] = float(f"{lr * FINE_TUNE_BACKBONE_SHARE:.3g}")
    return out

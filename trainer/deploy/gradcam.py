"""Grad-CAM (Selvaraju et al., 2017): where in an image the network found the evidence for a class.

The target layer is the last module, in execution order, whose output is still a spatial map (N, C, H, W with
H·W > 1): the last residual block of a ResNet, the last conv block of the built-in CNN, and so on for any
classifier. The map is the ReLU of the activations weighted by their spatially averaged gradients.
Run as `main.py grad-cam RUN_DIR IMAGE --out PNG` (the app calls that in a subprocess).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainer.core.errors import InputError

OVERLAY_SIZE = 320  # side of the overlay image, in pixels
OVERLAY_ALPHA = 0.45
# a perceptually ordered dark-to-bright colour ramp (anchor colours of "inferno"); interpolated linearly
RAMP = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float32)


class NoSpatialLayer(InputError, ValueError):
    pass


def grad_cam(net: torch.nn.Module, x: torch.Tensor, target: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cam, logits) for one preprocessed image batch of 1: cam is (H, W) in [0, 1] at the target layer's
    resolution, for `target` (default: the predicted class; a multi-label run's label: its own logit)."""
    last: dict = {}

    def keep(module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.dim() == 4 and output.shape[-1] * output.shape[-2] > 1:
            last["map"] = output

    handles = [m.register_forward_hook(keep) for m in net.modules() if m is not net]
    try:
        net.eval()
        with torch.enable_grad():
            logits = net(x)
            if "map" not in last:
                raise NoSpatialLayer("the model has no layer with a spatial output (N, C, H, W) to explain")
            activations = last["map"]
            cls = int(logits.argmax(1)) if target is None else target
            (grads,) = torch.autograd.grad(logits[0, cls], activations)
    finally:
        for h in handles:
            h.remove()
    weights = grads.mean(dim=(2, 3), keepdim=True)
    cam = F.relu((weights * activations).sum(1))[0].detach().float()
    peak = cam.max()
    cam = cam / peak if peak > 0 else cam
    return cam, logits.detach().float()


def overlay(image: torch.Tensor, cam: torch.Tensor, alpha: float = OVERLAY_ALPHA) -> np.ndarray:
    """The (3, S, S) uint8 image with the cam upsampled over it in colour, as an (S, S, 3) uint8 array."""
    heat = F.interpolate(cam[None, None], size=tuple(image.shape[-2:]), mode="bilinear", align_corners=False)[0, 0].numpy()
    pos = np.clip(heat, 0, 1) * (len(RAMP) - 1)
    low = np.floor(pos).astype(int).clip(0, len(RAMP) - 2)
    colours = RAMP[low] + (pos - low)[..., None] * (RAMP[low + 1] - RAMP[low])
    base = image.permute(1, 2, 0).numpy().astype(np.float32)
    return np.clip((1 - alpha) * base + alpha * colours, 0, 255).astype(np.uint8)


def grad_cam_for_run(run_path: Path, image_path: Path, out: Path, which: str = "best",
                     class_name: str | None = None) -> dict:
    """Grad-CAM of a run's checkpoint on one image, preprocessed as in training; the overlay PNG written to `out`
    and a summary (predicted class, confidence, explained class, peak position as fractions of the image)."""
    from PIL import Image

    from trainer.core.rundir import RunDir
    from trainer.data.loader import decode_image
    from trainer.deploy.inference import first_line, load_run_model

    model = load_run_model(RunDir(run_path), which)
    classes, pre = model.classes, model.preprocess
    if class_name is not None and class_name not in classes:
        raise InputError(f"--class: {class_name!r} is not a class of the run ({', '.join(classes)})")
    try:
        pixels = pre.decode(str(image_path))
        shown = decode_image(str(image_path), pre.frame.scaled(OVERLAY_SIZE))  # the same fit, at a size people see
    except Exception as e:  # noqa: BLE001 - any unreadable file: name it
        raise InputError(f"{image_path}: cannot read image ({first_line(e)})") from e
    x = pre.to_input(pixels[None])
    target = classes.index(class_name) if class_name else None
    with pre.autocast():  # the run's precision: the confidence shown is the one evaluate and predict give
        cam, logits = grad_cam(model.net, x, target)
    probs = model.probabilities(logits)[0]  # softmax, or a multi-label run's sigmoid per label
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(overlay(shown, cam)).save(out)
    row, col = divmod(int(cam.argmax()), cam.shape[1])
    predicted = int(probs.argmax())
    explained = target if target is not None else predicted
    return {"image": str(image_path), "overlay": str(out), "predicted": classes[predicted],
            "confidence": probs[predicted].item(), "explained": classes[explained],
            "explained_probability": probs[explained].item(),
            "peak": [(row + 0.5) / cam.shape[0], (col + 0.5) / cam.shape[1]], "map_size": list(cam.shape)}

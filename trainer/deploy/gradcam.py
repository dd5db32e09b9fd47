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

OVERLAY_SIZE = 320  # the overlay image's longer side, in pixels
OVERLAY_ALPHA = 0.45
OUTSIDE_DIM = 0.4  # the parts of the image the network does not see (cropped away) are drawn this bright
SCALE_HEIGHT = 18  # px: the colour scale under the overlay (no evidence ... the map's peak)
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


def with_scale(picture: np.ndarray) -> np.ndarray:
    """`picture` with the colour scale under it: the ramp from no evidence (left) to the map's peak (right)."""
    from PIL import Image, ImageDraw

    height, width = picture.shape[:2]
    pos = np.linspace(0, len(RAMP) - 1, width)
    low = np.floor(pos).astype(int).clip(0, len(RAMP) - 2)
    ramp = RAMP[low] + (pos - low)[:, None] * (RAMP[low + 1] - RAMP[low])
    strip = np.full((SCALE_HEIGHT, width, 3), 255, np.uint8)
    strip[2:8] = ramp.astype(np.uint8)[None]
    image = Image.fromarray(strip)
    draw = ImageDraw.Draw(image)
    draw.text((1, 7), "none", fill=(60, 60, 60))
    draw.text((width - 26, 7), "peak", fill=(60, 60, 60))
    return np.concatenate([picture, np.asarray(image)], axis=0)


def seen_box(height: int, width: int, frame) -> tuple[int, int, int, int] | None:
    """Where the network's input lies in an image of `height` x `width` (top, left, bottom, right), when its frame
    crops the image (the centre, at the frame's shape, as `decode_image` cuts it); None when it sees all of it."""
    if frame.fit != "crop":
        return None
    if width * frame.height > height * frame.width:  # wider than the frame: the sides are cut
        seen = max(1, round(height * frame.width / frame.height))
        left = (width - seen) // 2
        box = (0, left, height, left + seen)
    else:
        seen = max(1, round(width * frame.height / frame.width))
        top = (height - seen) // 2
        box = (top, 0, top + seen, width)
    return None if box == (0, 0, height, width) else box


def whole_view(path: str, frame, cam: torch.Tensor) -> tuple[np.ndarray, tuple[int, int, int, int] | None]:
    """The whole image (its longer side OVERLAY_SIZE) with the map over the part the network sees and the rest
    dimmed and outlined (issue #71: a wide image showed only its centre square), and that part's box."""

    from trainer.data.frame import Frame
    from trainer.data.loader import ORIENTATION_TAG, decode_image
    from trainer.data.scan import open_image

    with open_image(path) as img:
        width, height = img.size
        if img.getexif().get(ORIENTATION_TAG, 1) in (5, 6, 7, 8):  # shown upright: turned a quarter
            width, height = height, width
    scale = OVERLAY_SIZE / max(width, height)
    shape = max(1, round(height * scale)), max(1, round(width * scale))
    box = seen_box(*shape, frame)
    if box is None:
        return overlay(decode_image(path, frame.scaled(OVERLAY_SIZE)), cam), None
    whole = decode_image(path, Frame(*shape, "crop"))  # the same proportions: the whole image
    top, left, bottom, right = box
    picture = whole.permute(1, 2, 0).numpy().astype(np.float32) * OUTSIDE_DIM
    picture[top:bottom, left:right] = overlay(whole[:, top:bottom, left:right], cam)
    edge = np.array([255, 255, 255], np.float32)
    picture[top:bottom, [left, right - 1]] = edge
    picture[[top, bottom - 1], left:right] = edge
    return picture.astype(np.uint8), box


def grad_cam_for_run(run_path: Path, image_path: Path, out: Path, which: str = "best",
                     class_name: str | None = None) -> dict:
    """Grad-CAM of a run's checkpoint on one image, preprocessed as in training; the overlay PNG written to `out`
    and a summary (predicted class, confidence, explained class, peak position as fractions of the image)."""
    from PIL import Image

    from trainer.core.rundir import RunDir
    from trainer.deploy.inference import first_line, load_run_model

    model = load_run_model(RunDir(run_path), which)
    classes, pre = model.classes, model.preprocess
    if class_name is not None and class_name not in classes:
        raise InputError(f"--class: {class_name!r} is not a class of the run ({', '.join(classes)})")
    try:
        pixels = pre.decode(str(image_path))
    except Exception as e:  # noqa: BLE001 - any unreadable file: name it
        raise InputError(f"{image_path}: cannot read image ({first_line(e)})") from e
    x = pre.to_input(pixels[None])
    target = classes.index(class_name) if class_name else None
    with pre.autocast():  # the run's precision: the confidence shown is the one evaluate and predict give
        cam, logits = grad_cam(model.net, x, target)
    probs = model.probabilities(logits)[0]  # softmax, or a multi-label run's sigmoid per label
    picture, box = whole_view(str(image_path), pre.frame, cam)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(with_scale(picture)).save(out)
    row, col = divmod(int(cam.argmax()), cam.shape[1])
    predicted = int(probs.argmax())
    explained = target if target is not None else predicted
    return {"image": str(image_path), "overlay": str(out), "predicted": classes[predicted],
            "confidence": probs[predicted].item(), "explained": classes[explained],
            "explained_probability": probs[explained].item(),
            "peak": [(row + 0.5) / cam.shape[0], (col + 0.5) / cam.shape[1]], "map_size": list(cam.shape),
            # where the network's input lies in the picture (top, left, bottom, right, as fractions): None, all of it
            "seen": None if box is None else [box[0] / picture.shape[0], box[1] / picture.shape[1],
                                              box[2] / picture.shape[0], box[3] / picture.shape[1]]}

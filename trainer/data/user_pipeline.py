"""data.augment.albumentations: a user's own per-image pipeline, written in the config as a list of Albumentations
transforms (`- TransformName: {argument: value}`), run on each training image before the trainer's crop and flip.

Only Albumentations' own transform classes can be named (nothing is imported by name from elsewhere). Its random
draws are seeded from the run's checkpointed augmentation generator, one seed a batch, so a resumed run augments
exactly as before. The images keep their shape: a transform that changes it is refused, naming its entry.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.core.errors import InputError

KEY = "data.augment.albumentations"


class PipelineError(InputError, ValueError):
    """An entry of data.augment.albumentations that cannot be built or run; the message names it."""


def build_pipeline(entries: list[dict]):
    """The Albumentations Compose of `entries`; PipelineError naming the entry at fault."""
    try:
        import albumentations as A
    except ImportError as e:
        raise PipelineError(f"{KEY}: needs Albumentations, which is not installed here "
                            "(pip install -e '.[augment]')") from e
    transforms = []
    for i, entry in enumerate(entries):
        where = f"{KEY}[{i}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise PipelineError(f"{where}: must be one transform, written TransformName: {{arguments}}; got {entry!r}")
        (name, arguments), = entry.items()
        kind = getattr(A, str(name), None)
        if not (isinstance(kind, type) and issubclass(kind, A.BasicTransform)):
            raise PipelineError(f"{where}: {name!r} is not an Albumentations transform")
        if not isinstance(arguments or {}, dict):
            raise PipelineError(f"{where}: {name}'s arguments must be a mapping, got {arguments!r}")
        try:
            transforms.append(kind(**(arguments or {})))
        except Exception as e:  # noqa: BLE001 - whatever the transform says about its arguments
            said = " ".join(str(e).split())[:300] or type(e).__name__
            raise PipelineError(f"{where}: {name} with {arguments or 'no arguments'}: {said}") from e
    return A.Compose(transforms)


def run_pipeline(pipeline, x: torch.Tensor, seed: int, entries: list[dict]) -> torch.Tensor:
    """Each image of the float (N, 3, H, W) batch (pixel values 0-255) through `pipeline`, as uint8 H x W x 3 on the
    CPU, with draws seeded by `seed`; back on x's device as floats."""
    pipeline.set_random_seed(seed)
    images = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    out = []
    for image in images:
        result = pipeline(image=np.ascontiguousarray(image))["image"]
        if result.shape != image.shape:
            raise PipelineError(f"{KEY}: the pipeline turned a {image.shape[1]}x{image.shape[0]} image into "
                                f"{result.shape[1]}x{result.shape[0]}; the images must keep their size "
                                f"({', '.join(next(iter(e)) for e in entries)}: leave resizing to data.image_size)")
        out.append(torch.from_numpy(np.ascontiguousarray(result)))
    return torch.stack(out).permute(0, 3, 1, 2).to(x.device).float()

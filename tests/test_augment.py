"""The augmentation policies of data.augment (issue #47) on real photographs: random erasing paints a rectangle with
the image's mean colour, TrivialAugment and RandAugment change each image its own way, MixUp blends two images and
their labels alike, CutMix pastes a rectangle of another image and mixes the labels by its area; the same generator
state draws the same batch (a resumed run augments as before); the policies train a single-label and a multi-label
run to a finite loss."""

import re

import numpy as np
import pytest
import torch
from helpers import digit_mosaics, run_here, write_config
from PIL import Image

from trainer.core.config import AugmentConfig
from trainer.core.events import read_events
from trainer.data.loader import ERASE_AREA, BatchAugment

SIZE = 64


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """Four of scikit-image's photographs at 64 px, a float batch 0-255."""
    from skimage import data

    images = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    return torch.stack([torch.from_numpy(np.asarray(Image.fromarray(p).convert("RGB").resize((SIZE, SIZE))).copy())
                        .permute(2, 0, 1) for p in images]).float()


def policy(**on) -> BatchAugment:
    plain = dict(hflip=False, random_resized_crop=False, crop_scale_min=0.6, color_jitter=0.0)
    return BatchAugment(AugmentConfig(**{**plain, **on}), [0.0] * 3, [1.0] * 3, torch.device("cpu"))


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def box(mask: torch.Tensor) -> tuple[int, int, int, int]:
    rows, cols = mask.any(1).nonzero().ravel(), mask.any(0).nonzero().ravel()
    return int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1


def test_random_erasing_paints_a_rectangle_with_the_image_s_mean_colour(photos):
    out = policy(random_erasing=1.0).augment(photos.clone(), generator(0))
    for image, erased in zip(photos, out):
        changed = (erased != image).any(0)
        top, bottom, left, right = box(changed)
        assert changed[top:bottom, left:right].float().mean() > 0.97, "one filled rectangle"
        assert ERASE_AREA[0] - 0.01 <= (bottom - top) * (right - left) / SIZE**2 <= ERASE_AREA[1] + 0.01
        painted = erased[:, top:bottom, left:right].reshape(3, -1)
        assert torch.allclose(painted, image.mean((1, 2)).view(3, 1).expand_as(painted))
        assert torch.equal(erased[:, ~changed], image[:, ~changed]), "the rest untouched"
    many = photos.repeat(16, 1, 1, 1)
    erased = (policy(random_erasing=0.5).augment(many.clone(), generator(1)) != many).flatten(1).any(1).sum()
    assert 20 <= erased <= 44, f"about half of 64 images erased, not {erased}"


def test_mixup_blends_two_images_and_their_labels_alike(photos):
    labels = torch.tensor([0, 1, 2, 3])
    out, target = policy(mixup=0.4).mix(photos.clone(), labels, generator(2), 4)
    assert torch.allclose(target.sum(1), torch.ones(4)) and target.shape == (4, 4)
    blended = 0
    for i in range(4):
        lam = float(target[i, i])
        if lam > 0.999:
            continue  # mixed with itself (its own place in the other order)
        other = int(torch.tensor([t if k != i else -1 for k, t in enumerate(target[i].tolist())]).argmax())
        assert float(target[i, other]) == pytest.approx(1 - lam, abs=1e-6)
        assert torch.allclose(out[i], lam * photos[i] + (1 - lam) * photos[other], atol=1e-3)
        blended += 1
    assert blended >= 2
    # multi-label targets, the same draws (same seed): each image's labels blended with its partner's alike
    multi = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.float)
    _, soft = policy(mixup=0.4).mix(photos.clone(), multi, generator(2), 3)
    for i in range(4):
        lam = float(target[i, i])
        partner = i if lam > 0.999 else int(torch.tensor([t if k != i else -1 for k, t in
                                                          enumerate(target[i].tolist())]).argmax())
        assert torch.allclose(soft[i], lam * multi[i] + (1 - lam) * multi[partner])


def test_cutmix_pastes_a_rectangle_of_another_image_and_mixes_labels_by_its_area(photos):
    labels = torch.tensor([0, 1, 2, 3])
    out, target = policy(cutmix=1.0).mix(photos.clone(), labels, generator(3), 4)
    pasted = 0
    for i in range(4):
        changed = (out[i] != photos[i]).any(0)
        if not changed.any():
            continue
        other = int(torch.tensor([t if k != i else -1 for k, t in enumerate(target[i].tolist())]).argmax())
        top, bottom, left, right = box(changed)
        assert torch.equal(out[i][:, top:bottom, left:right], photos[other][:, top:bottom, left:right])
        area = (bottom - top) * (right - left) / SIZE**2
        assert float(target[i, other]) == pytest.approx(area, abs=0.02), "the label's share is the pasted area's"
        assert float(target[i, i]) == pytest.approx(1 - float(target[i, other]))
        pasted += 1
    assert pasted >= 2


@pytest.mark.parametrize("name", ["trivial_augment", "rand_augment"])
def test_a_policy_changes_each_image_its_own_way_and_leaves_torch_s_own_randomness_alone(photos, name):
    many = photos.repeat(4, 1, 1, 1)  # each photograph four times: the copies get operations of their own
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    out = policy(policy=name).augment(many.clone(), generator(6))
    assert torch.equal(torch.rand(3), expected_next), "the global generator as it was"
    assert out.shape == many.shape and out.min() >= 0 and out.max() <= 255
    changed = (out != many).flatten(1).any(1)
    assert changed.sum() >= 10, f"most of the 16 images changed, not {int(changed.sum())}"
    copies = out.view(4, 4, 3, SIZE, SIZE)
    assert any(not torch.equal(copies[0, k], copies[1, k]) for k in range(4)), "per image, not one op per batch"


def test_the_same_generator_state_draws_the_same_batch(photos):
    """What a resumed run relies on: its checkpoint holds the generator's state, and the draws follow from it."""
    augment = policy(hflip=True, random_resized_crop=True, color_jitter=0.3, policy="trivial_augment",
                     random_erasing=0.5, mixup=0.2, cutmix=1.0)
    labels = torch.tensor([0, 1, 2, 3])
    g = generator(4)
    state = g.get_state()
    first = augment.mix(augment.augment(photos.clone(), g), labels, g, 4)
    g.set_state(state)
    again = augment.mix(augment.augment(photos.clone(), g), labels, g, 4)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    later = augment.mix(augment.augment(photos.clone(), g), labels, g, 4)
    assert not torch.equal(first[0], later[0]), "the next batch draws anew"


def test_your_own_albumentations_pipeline_runs_on_each_image_as_written_and_draws_from_the_run_s_generator(photos):
    """data.augment.albumentations: a list of Albumentations transforms, each image through it (before the crop and
    flip), its draws seeded from the run's generator; a bad entry is refused naming it."""
    from trainer.data.user_pipeline import PipelineError

    grey = policy(albumentations=[{"ToGray": {"p": 1.0}}]).augment(photos.clone(), generator(0))
    assert grey.shape == photos.shape and not torch.equal(grey, photos)
    assert (grey[:, 0] - grey[:, 1]).abs().max() <= 1 and (grey[:, 1] - grey[:, 2]).abs().max() <= 1, "all grey"
    mirror = policy(albumentations=[{"HorizontalFlip": {"p": 0.5}}])
    seen = []
    for seed in range(6):
        g = generator(seed)
        state = g.get_state()
        out = mirror.augment(photos.clone(), g)
        flipped = [torch.equal(o, p.flip(-1)) for o, p in zip(out, photos)]
        assert all(f or torch.equal(o, p) for f, o, p in zip(flipped, out, photos)), "each image itself or mirrored"
        g.set_state(state)
        assert torch.equal(mirror.augment(photos.clone(), g), out), "the same generator state, the same batch"
        seen += flipped
    assert 0.2 < sum(seen) / len(seen) < 0.8, seen
    for entries, said in (([{"Sharpen": {}}, {"Nope": {}}], "albumentations[1]: 'Nope' is not an Albumentations"),
                          ([{"GaussNoise": {"p": 7}}], "albumentations[0]: GaussNoise with {'p': 7}"),
                          ([{"ToGray": {}, "Blur": {}}], "albumentations[0]: must be one transform")):
        with pytest.raises(PipelineError, match=re.escape(said)):
            policy(albumentations=entries)
    with pytest.raises(PipelineError, match="turned a 64x64 image into 16x16; the images must keep their size"):
        policy(albumentations=[{"Resize": {"height": 16, "width": 16}}]).augment(photos.clone(), generator(0))


@pytest.mark.slow  # two training runs
def test_mixup_and_cutmix_train_a_single_and_a_multi_label_run_to_a_finite_loss(shapes_dir, tmp_path):
    mixing = {"mixup": 0.2, "cutmix": 1.0, "random_erasing": 0.25, "policy": "trivial_augment",
              "albumentations": [{"ToGray": {"p": 0.3}}, {"GaussNoise": {"p": 0.3}}]}
    single = write_config(tmp_path, shapes_dir, data={"augment": mixing}, train={"epochs": 2})
    done = run_here("train", single, "--run-dir", tmp_path / "single")
    assert done.returncode == 0, done.stderr[-2000:]
    mosaics = digit_mosaics(tmp_path / "mosaics", 160)
    multi = write_config(tmp_path / "mosaics", mosaics.parent, data={"labels": str(mosaics), "augment": mixing},
                         loss={"name": "bce"}, train={"epochs": 2, "early_stop": {"metric": "val_map"}})
    done = run_here("train", multi, "--run-dir", tmp_path / "multi")
    assert done.returncode == 0, done.stderr[-2000:]
    for run in ("single", "multi"):
        events = read_events(tmp_path / run / "events.jsonl")
        losses = [e["train_loss"] for e in events if e["event"] == "epoch"]
        assert len(losses) == 2 and all(np.isfinite(losses)), (run, losses)
        start = next(e for e in events if e["event"] == "run_start")
        assert start["config"]["data"]["augment"]["cutmix"] == 1.0
    refused = run_here("train", single, "--run-dir", tmp_path / "bad", "--set",
                       "data.augment.albumentations=[{GaussNoise: {p: 7}}]")
    assert refused.returncode == 2 and "albumentations[0]: GaussNoise" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "bad").exists(), "refused before a run directory"
    refused = run_here("train", single, "--run-dir", tmp_path / "nll", "--set", "loss.name=nll")
    assert refused.returncode == 2 and "data.augment.mixup" in refused.stderr and "nll" in refused.stderr

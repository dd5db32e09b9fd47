"""Unbalanced classes: loss.class_weights: auto and data.sampler: balanced do what they say."""

from collections import Counter

import pytest
import torch
from helpers import build_parts, train_here, write_config

from trainer.core.config import LossConfig
from trainer.core.events import read_events
from trainer.data.loader import epoch_batches
from trainer.device.strategy import make_strategy
from trainer.train.optim import build_loss, class_weights


def test_class_weights_are_inverse_frequency_normalised_to_mean_one():
    w = class_weights([30, 10, 60])
    inverse = [1 / 30, 1 / 10, 1 / 60]
    assert w.tolist() == pytest.approx([v / (sum(inverse) / 3) for v in inverse])  # [2/3, 2, 1/3]
    assert w.mean().item() == pytest.approx(1.0) and w[1] / w[0] == pytest.approx(3.0)
    assert class_weights([5, 0, 5]).tolist() == pytest.approx([1.0, 0.0, 1.0])


def test_the_weighted_loss_is_the_class_weighted_mean():
    counts = [30, 10, 60]
    loss = build_loss(LossConfig(class_weights="auto"), 3, counts)
    logits, labels = torch.randn(8, 3), torch.tensor([0, 1, 2, 1, 1, 0, 2, 2])
    w = class_weights(counts)
    per = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    expected = (w[labels] * per).sum() / w[labels].sum()
    assert loss(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)
    assert build_loss(LossConfig(), 3, counts)(logits, labels).item() == pytest.approx(per.mean().item(), rel=1e-6)


def test_the_balanced_sampler_sees_every_class_about_equally_often_and_is_seeded():
    labels = [0] * 900 + [1] * 90 + [2] * 10
    batches = epoch_batches(len(labels), 50, seed=3, epoch=0, labels=labels)
    seen = Counter(labels[i] for batch in batches for i in batch)
    assert sum(seen.values()) == 1000 and all(280 <= seen[c] <= 390 for c in range(3)), seen
    assert batches == epoch_batches(len(labels), 50, seed=3, epoch=0, labels=labels), "depends only on seed and epoch"
    assert batches != epoch_batches(len(labels), 50, seed=3, epoch=1, labels=labels)
    ranks = [epoch_batches(len(labels), 25, seed=3, epoch=0, rank=r, world=2, labels=labels) for r in (0, 1)]
    assert sorted(i for r in ranks for b in r for i in b) == sorted(i for b in batches for i in b)


def test_an_unbalanced_run_trains_with_both_fixes(tmp_path):
    """What the trainer really uses: its loss weighs the rare class up (and a run without the setting does not), its
    epochs draw the rare class about as often as the common one (and unbalanced epochs do not), and the run trains."""
    from trainer.data.demo_data import write_demo_dataset

    root = write_demo_dataset(tmp_path / "data", per_class=40, size=16, seed=9, classes=("circle", "square"))
    for extra in sorted((root / "square").iterdir())[6:]:
        extra.unlink()  # 40 circles, 6 squares
    cfg_path = write_config(tmp_path, root, data={"sampler": "balanced"}, loss={"class_weights": "auto"},
                            train={"epochs": 1}, monitor={"log_every": 1})

    def drawn(cfg, parts) -> Counter:
        labels = [label for _, label in parts.data.train.samples]
        return Counter(labels[i] for b in parts.epoch_batches(cfg, make_strategy(cfg), 0) for i in b)

    cfg, parts = build_parts(cfg_path)
    counts = parts.data.train_counts()
    assert counts[0] > 4 * counts[1]
    assert parts.criterion.weight.tolist() == pytest.approx(class_weights(counts).tolist())
    seen = drawn(cfg, parts)
    assert 0.6 <= seen[1] / seen[0] <= 1.6, seen
    plain_cfg, plain = build_parts(cfg_path, ["data.sampler=shuffle", "loss.class_weights=none"])
    assert plain.criterion.weight is None and drawn(plain_cfg, plain)[1] * 4 < drawn(plain_cfg, plain)[0]

    run, code = train_here(cfg_path, tmp_path / "runs")
    assert code == 0, run.tail_log()
    assert any(e["event"] == "epoch" for e in read_events(run.events))

"""Validation at each epoch's end: loss and accuracy (or mAP), per class, the confusion matrix, and the best epoch's
per-image predictions in eval/val/ (what the app reads).

Predicted through the one inference path (`LoadedModel`), as `main.py evaluate` does with the checkpoint, at the
training precision and memory format. Under DDP every rank validates its share and one all-reduce gathers them.
"""

from __future__ import annotations

import torch

from trainer.core import clock
from trainer.core.config import RunConfig
from trainer.core.rundir import RunDir
from trainer.data import loader as data_mod
from trainer.data.frame import Frame
from trainer.deploy.evaluation import Predictions, top_classes, write_evaluation
from trainer.deploy.inference import LoadedModel, Preprocess
from trainer.deploy.multilabel import average_precision, mean_average_precision, write_multilabel_evaluation
from trainer.device.strategy import Strategy
from trainer.train.parts import Parts

EVAL_BATCH_FACTOR = 2  # validation batches are this many training batches


class Validation:
    def __init__(self, run: RunDir, cfg: RunConfig, strategy: Strategy, parts: Parts, frame: Frame):
        self.run, self.cfg, self.strategy, self.parts, self.frame = run, cfg, strategy, parts, frame
        self.inference = LoadedModel(parts.eval_net, parts.classes, Preprocess(
            frame, tuple(parts.mean), tuple(parts.std), parts.precision.amp,
            str(parts.memory_format).removeprefix("torch."), cfg.eval.tta))
        self._rows: tuple[list[int], list[torch.Tensor]] = ([], [])  # the last evaluate's: (indices, logit batches)

    @torch.inference_mode()
    def evaluate(self, epoch: int) -> dict:
        """Validation loss, accuracy (top-5 with more than 5 classes), per-class accuracy and the confusion matrix;
        the network is left in training `epoch`'s mode.

        At the training precision and memory format, without autograd bookkeeping, in batches twice the training
        batch (no activations are kept for a backward pass, so they fit where training's did)."""
        cfg, s, parts = self.cfg, self.strategy, self.parts
        n = len(parts.classes)
        if parts.data.multilabel:
            return self._multilabel(epoch)
        parts.eval_net.eval()  # unwrapped: evaluation needs no gradient sync
        s.share_buffers(parts.eval_net)  # every rank validates the network the checkpoint holds
        loss_sum = torch.zeros((), device=s.device)
        top5 = torch.zeros((), device=s.device)
        confusion = torch.zeros(n * n, device=s.device)
        batches = data_mod.epoch_batches(len(parts.data.val), EVAL_BATCH_FACTOR * cfg.data.batch_size, seed=0,
                                         epoch=0, rank=s.rank, world=s.world_size, shuffle=False, pad=False)
        kept = []  # this rank's per-image logits, for eval/val when the epoch is the best (val_rows)
        for images, labels in data_mod.iterate_batches(parts.data.val, batches, parts.workers, self.frame,
                                                       s.device):
            y = labels.to(s.device, non_blocking=True)
            logits = self.inference.logits(images, s.device)
            clock.charge_images(cfg.model.name, images.shape[0], images.shape[-2], images.shape[-1], evaluating=True)
            loss_sum += parts.criterion(logits, y) * y.shape[0]
            kept.append(logits.float())  # stays on the device: one copy when written, no sync per batch
            top = top_classes(logits, 5 if n > 5 else 1)  # ties as in metrics.json: one prediction an image
            confusion += torch.bincount(y * n + top[:, 0], minlength=n * n).float()
            if n > 5:
                top5 += (top == y[:, None]).any(1).sum()
        self._rows = ([i for batch in batches for i in batch], kept)  # joined only at a best epoch (val_logits)
        totals = s.all_reduce_sum(torch.cat([loss_sum[None], top5[None], confusion])).cpu()  # host sync
        conf = totals[2:].view(n, n)
        seen = conf.sum().clamp_min(1)
        support = conf.sum(1)
        # A class without validation images has no accuracy (null), which is not the same as 0%.
        per_class = [None if support[i] == 0 else (conf[i, i] / support[i]).item() for i in range(n)]
        out = {"val_loss": (totals[0] / seen).item(), "val_acc": (conf.diag().sum() / seen).item(),
               "per_class_acc": per_class, "confusion": conf.long().tolist()}
        if n > 5:
            out["val_top5"] = (totals[1] / seen).item()
        parts.train_mode(epoch)
        return out

    @torch.inference_mode()
    def _multilabel(self, epoch: int) -> dict:
        """Multi-label validation: loss, mAP (macro, micro; trainer.deploy.multilabel) and label accuracy (each
        image-label pair right at 0.5). Every rank ends with every image's logits (each fills its own rows, then one
        sum), so mAP is measured on the whole split."""
        cfg, s, parts = self.cfg, self.strategy, self.parts
        parts.eval_net.eval()
        total = len(parts.data.val)
        logits_all = torch.zeros(total, len(parts.classes), device=s.device)
        targets = torch.zeros_like(logits_all)
        loss_sum = torch.zeros((), device=s.device)
        batches = data_mod.epoch_batches(total, EVAL_BATCH_FACTOR * cfg.data.batch_size, seed=0, epoch=0,
                                         rank=s.rank, world=s.world_size, shuffle=False, pad=False)
        for index, (images, labels) in zip(batches, data_mod.iterate_batches(parts.data.val, batches, parts.workers,
                                                                             self.frame, s.device)):
            y = labels.to(s.device, non_blocking=True).float()
            logits = self.inference.logits(images, s.device).float()
            clock.charge_images(cfg.model.name, images.shape[0], images.shape[-2], images.shape[-1], evaluating=True)
            loss_sum += parts.criterion(logits, y) * y.shape[0]
            logits_all[index], targets[index] = logits, y
        both = s.all_reduce_sum(torch.cat([loss_sum[None], logits_all.flatten(), targets.flatten()])).cpu()
        size = logits_all.numel()
        logits_all, targets = both[1:1 + size].view_as(logits_all), both[1 + size:].view_as(logits_all)
        self._rows = (list(range(total)), [logits_all])  # every rank holds the whole split's already
        macro, micro = mean_average_precision(logits_all, targets)
        per_label = [average_precision(logits_all[:, j], targets[:, j]) for j in range(len(parts.classes))]
        parts.train_mode(epoch)
        return {"val_loss": (both[0] / max(total, 1)).item(), "val_map": macro or 0.0, "val_map_micro": micro or 0.0,
                "val_acc": ((logits_all >= 0) == (targets > 0.5)).float().mean().item(), "per_class_ap": per_label}

    def write_predictions(self, epoch: int) -> None:
        """The best epoch's per-image validation predictions, in eval/val/ (the app reads them): the logits
        `evaluate` computed, each rank's rows gathered (a collective: every rank calls it), written by rank 0. The
        same numbers as the epoch's val_acc, whatever the launcher."""
        parts, s = self.parts, self.strategy
        samples = parts.data.val.samples
        logits = self.logits(len(samples))
        if not s.is_main:
            return
        labels = torch.tensor([label for _, label in samples])
        if parts.data.multilabel:  # the thresholds chosen here are the run's: evaluate, predict and exports use them
            write_multilabel_evaluation(self.run.path, "val", [p for p, _ in samples], logits, labels,
                                        parts.classes, extra={"epoch": epoch})
            return
        preds = Predictions([p for p, _ in samples], labels, logits)
        write_evaluation(self.run.path, "val", preds, parts.classes, extra={"epoch": epoch})

    def logits(self, total: int) -> torch.Tensor:
        """Every validation image's logits from the last `evaluate`, in the split's order (float32, on the CPU): each
        rank fills its own rows, one sum gathers them (a rank's rows are disjoint: pad=False)."""
        rows, batches = self._rows
        logits = torch.cat(batches) if batches else torch.zeros(0, len(self.parts.classes), device=self.strategy.device)
        if self.parts.data.multilabel or self.strategy.world_size == 1:
            return logits.cpu()
        whole = torch.zeros(total, len(self.parts.classes), device=self.strategy.device)
        if rows:
            whole[torch.tensor(rows, device=whole.device)] = logits
        return self.strategy.all_reduce_sum(whole).cpu()

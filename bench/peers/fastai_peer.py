"""fastai as its users run it: vision_learner(resnet18, pretrained=False), aug_transforms, lr_find().valley,
fit_one_cycle(E), for bench/auto.py. E from a one-epoch calibration (not counted), filling 90% of the budget that
lr_find leaves."""

import copy
import time

from fastai.callback.core import Callback
from fastai.vision.all import (
    ImageDataLoaders,
    Resize,
    accuracy,
    aug_transforms,
    resnet18,
    vision_learner,
)
from peer_common import Clock, epochs_for, parse_args, write


class KeepBest(Callback):
    """The weights of the epoch with the best validation accuracy, kept in memory."""
    order = 100

    def before_fit(self):
        self.best, self.state = -1.0, None

    def after_epoch(self):
        acc = float(self.recorder.values[-1][2])  # train_loss, valid_loss, accuracy
        if acc > self.best:
            self.best, self.state = acc, copy.deepcopy(self.model.state_dict())


def learner(data: str, size: int):
    dls = ImageDataLoaders.from_folder(data, train="train", valid="val", item_tfms=Resize(size),
                                       batch_tfms=aug_transforms(), bs=64, num_workers=2, seed=0)
    return vision_learner(dls, resnet18, pretrained=False, metrics=accuracy)


def test_accuracy(learn, data: str) -> float:
    dl = learn.dls.test_dl(sorted(__import__("pathlib").Path(data, "test").glob("*/*")), with_labels=True)
    _, acc = learn.validate(dl=dl)  # loss, accuracy
    return float(acc)


def main() -> None:
    args = parse_args()
    probe = learner(args.data, args.size)
    start = time.time()
    with probe.no_bar(), probe.no_logging():
        probe.fit_one_cycle(1, 1e-3)
    epoch_s = time.time() - start
    clock = Clock()
    learn = learner(args.data, args.size)
    with learn.no_bar(), learn.no_logging():
        lr = learn.lr_find(show_plot=False).valley
        epochs = epochs_for(args.minutes * 60, epoch_s, clock.elapsed())
        keep = KeepBest()
        learn.fit_one_cycle(epochs, lr, cbs=[keep])
    train_s = clock.elapsed()
    with learn.no_bar(), learn.no_logging():
        final = test_accuracy(learn, args.data)
        learn.model.load_state_dict(keep.state)
        best = test_accuracy(learn, args.data)
    write(args.out, best_acc=best, final_acc=final, epochs=epochs, train_s=train_s, calibration_s=epoch_s, lr=lr,
          model="resnet18", size=args.size)


if __name__ == "__main__":
    main()

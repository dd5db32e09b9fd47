"""torchvision's reference classification recipe (references/classification/train.py defaults: resnet18 from
scratch, SGD lr 0.1 momentum 0.9 weight decay 1e-4, StepLR every 30 epochs by 0.1, RandomResizedCrop + horizontal
flip, resize to 256/224 of the crop then centre crop for evaluation, batch 32, cross-entropy), for bench/auto.py."""

import copy
import time

import torch
import torchvision
from peer_common import Clock, epochs_for, parse_args, write
from torchvision import transforms as T

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def loaders(data: str, size: int):
    train = torchvision.datasets.ImageFolder(f"{data}/train", T.Compose([
        T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
    plain = T.Compose([T.Resize(int(size * 256 / 224)), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    val = torchvision.datasets.ImageFolder(f"{data}/val", plain)
    test = torchvision.datasets.ImageFolder(f"{data}/test", plain)
    make = lambda ds, shuffle: torch.utils.data.DataLoader(ds, batch_size=32, shuffle=shuffle, num_workers=2)  # noqa: E731
    return make(train, True), make(val, False), make(test, False), len(train.classes)


def accuracy(model, loader) -> float:
    model.eval()
    right = seen = 0
    with torch.no_grad():
        for x, y in loader:
            right += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    return right / seen


def train_epoch(model, loader, optimizer, criterion) -> None:
    model.train()
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def setup(classes: int):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    return model, optimizer, scheduler


def main() -> None:
    args = parse_args()
    train, val, test, classes = loaders(args.data, args.size)
    criterion = torch.nn.CrossEntropyLoss()
    model, optimizer, _ = setup(classes)  # calibration: one epoch, timed, thrown away (not counted)
    start = time.time()
    train_epoch(model, train, optimizer, criterion)
    accuracy(model, val)
    epoch_s = time.time() - start
    epochs = epochs_for(args.minutes * 60, epoch_s)
    clock = Clock()
    model, optimizer, scheduler = setup(classes)
    best_val, best_state = -1.0, None
    for _ in range(epochs):
        train_epoch(model, train, optimizer, criterion)
        scheduler.step()
        acc = accuracy(model, val)
        if acc > best_val:
            best_val, best_state = acc, copy.deepcopy(model.state_dict())
    train_s = clock.elapsed()
    final = accuracy(model, test)
    model.load_state_dict(best_state)
    write(args.out, best_acc=accuracy(model, test), final_acc=final, epochs=epochs, train_s=train_s,
          calibration_s=epoch_s, model="resnet18", size=args.size)


if __name__ == "__main__":
    main()

"""The training script a user would write from the seed documents: ImageFolder, PIL transforms, DataLoader, fp32
(with the benchmarks' common optimizer, so that it trains exactly what the trainer trains).

python bench/plain_loop.py DATA_DIR IMAGE_SIZE EPOCHS MODEL BATCH [--log-every N] -> one JSON line
"""

import json
import random
import sys
import time

import torch
import torchvision
from torch import nn
from torchvision import transforms as T

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from common import BENCH_OPTIMIZER  # noqa: E402


def main():
    root, size, epochs, model_name, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    torch.manual_seed(0)
    random.seed(0)
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    train_tf = T.Compose([T.RandomResizedCrop(size, scale=(0.6, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    val_tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), norm])
    full = torchvision.datasets.ImageFolder(root)
    idx = torch.randperm(len(full)).tolist()
    n_val = len(full) // 5
    train = torch.utils.data.Subset(torchvision.datasets.ImageFolder(root, train_tf), idx[n_val:])
    val = torch.utils.data.Subset(torchvision.datasets.ImageFolder(root, val_tf), idx[:n_val])
    workers = 1
    loader = torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=batch, num_workers=workers)
    if model_name == "small_cnn":
        from trainer.models import SmallCNN

        model = SmallCNN(len(full.classes))
    else:
        model = torchvision.models.get_model(model_name, num_classes=len(full.classes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=BENCH_OPTIMIZER["lr"], weight_decay=BENCH_OPTIMIZER["weight_decay"])
    criterion = nn.CrossEntropyLoss()
    images, train_time = 0, 0.0
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            images += len(y)
        train_time += time.perf_counter() - t0
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
    wall = time.perf_counter() - start
    print(json.dumps({"wall_s": wall, "train_images_per_s": images / train_time, "final_acc": correct / len(val),
                      "train_images": images}))


if __name__ == "__main__":
    main()

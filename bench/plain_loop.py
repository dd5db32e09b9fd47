"""The training script a user would write from the seed documents: ImageFolder, PIL transforms, DataLoader, fp32
(with the benchmarks' common optimizer, so that it trains exactly what the trainer trains).

python bench/plain_loop.py DATA_DIR IMAGE_SIZE EPOCHS MODEL BATCH [--no-augment] [--gpu] -> one JSON line

--no-augment: the leanest script: Resize + ToTensor, 2 loader workers, and one validation pass at the end (not per
epoch).
--gpu: in the style of torchvision's reference recipe on a GPU: fp16 autocast with a GradScaler, channels_last, loader
workers from the core count with pinned memory, non_blocking copies (on a machine without CUDA: the same on the CPU in
fp32, for the smoke test).
"""

import json
import os
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
    augment = "--no-augment" not in sys.argv
    gpu = "--gpu" in sys.argv
    device = torch.device("cuda" if gpu and torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    random.seed(0)
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    val_tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), norm])
    train_tf = (T.Compose([T.RandomResizedCrop(size, scale=(0.6, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(), norm])
                if augment else val_tf)
    full = torchvision.datasets.ImageFolder(root)
    idx = torch.randperm(len(full)).tolist()
    n_val = len(full) // 5
    train = torch.utils.data.Subset(torchvision.datasets.ImageFolder(root, train_tf), idx[n_val:])
    val = torch.utils.data.Subset(torchvision.datasets.ImageFolder(root, val_tf), idx[:n_val])
    workers = min(16, (os.cpu_count() or 2) - 1) if gpu else 1 if augment else 2
    pin = device.type == "cuda"
    loader = torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                         pin_memory=pin)
    val_loader = torch.utils.data.DataLoader(val, batch_size=batch, num_workers=workers, pin_memory=pin)
    if model_name == "small_cnn":
        from trainer.model.models import SmallCNN

        model = SmallCNN(len(full.classes))
    else:
        model = torchvision.models.get_model(model_name, num_classes=len(full.classes))
    memory_format = torch.channels_last if gpu else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    optimizer = torch.optim.AdamW(model.parameters(), lr=BENCH_OPTIMIZER["lr"], weight_decay=BENCH_OPTIMIZER["weight_decay"])
    criterion = nn.CrossEntropyLoss()
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    torch.backends.cudnn.benchmark = True
    images, train_time, epoch_rates = 0, 0.0, []
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        t0, seen = time.perf_counter(), 0
        for x, y in loader:
            x = x.to(device, non_blocking=True, memory_format=memory_format)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            seen += len(y)
        if device.type == "cuda":
            torch.cuda.synchronize()
        images += seen
        train_time += time.perf_counter() - t0
        epoch_rates.append(seen / (time.perf_counter() - t0))
        if not augment and epoch + 1 < epochs:
            continue  # the lean script validates once, at the end
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                    logits = model(x.to(device, memory_format=memory_format))
                correct += (logits.argmax(1).cpu() == y).sum().item()
    wall = time.perf_counter() - start
    print(json.dumps({"wall_s": wall, "train_images_per_s": images / train_time, "final_acc": correct / len(val),
                      "train_images": images, "epoch_images_per_s": epoch_rates}))


if __name__ == "__main__":
    main()

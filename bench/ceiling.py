"""The in-memory ceiling: the same model and batch on pre-decoded tensors, no data loading at all.

python bench/ceiling.py DATA_DIR IMAGE_SIZE EPOCHS MODEL BATCH PRECISION MEMORY_FORMAT -> one JSON line
"""

import contextlib
import json
import sys
import time
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import BENCH_OPTIMIZER  # noqa: E402

from trainer.data.frame import Frame  # noqa: E402
from trainer.data.loader import decode_image  # noqa: E402
from trainer.data.scan import scan_image_folder  # noqa: E402


def main():
    root, size, epochs, name, batch, amp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
        int(sys.argv[5]), sys.argv[6]
    memory_format = getattr(torch, sys.argv[7])
    torch.manual_seed(0)
    scan = scan_image_folder(root, full=False)
    x = torch.stack([decode_image(p, Frame(size, size)) for p, _ in scan.samples]).float().div(255)
    x = x.contiguous(memory_format=memory_format)
    y = torch.tensor([label for _, label in scan.samples])
    model = torchvision.models.get_model(name, num_classes=len(scan.classes)).to(memory_format=memory_format)
    opt = torch.optim.AdamW(model.parameters(), lr=BENCH_OPTIMIZER["lr"], weight_decay=BENCH_OPTIMIZER["weight_decay"],
                            fused=True)  # as the trainer runs it
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else contextlib.nullcontext()
    n = len(y) * 4 // 5
    images, start = 0, time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(n)
        for i in range(0, n - batch + 1, batch):
            idx = perm[i:i + batch]
            with ctx:
                loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            images += len(idx)
    print(json.dumps({"train_images_per_s": images / (time.perf_counter() - start)}))


if __name__ == "__main__":
    main()

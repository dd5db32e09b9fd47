"""Torch's CPU threads against another program busy beside training (issue #34: a 2-core machine with one spinning
process slowed Auto's training 4-8x): training steps per second with 1 and with all cores' threads, with and without
a CPU hog, interleaved.

    python bench/threads.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
from common import machine, save_result

from trainer.core.config import ModelConfig
from trainer.model.models import create_model


def steps_per_s(threads: int, model: str, size: int, batch: int, seconds: float = 8.0) -> float:
    torch.set_num_threads(threads)
    net = create_model(ModelConfig(name=model), 6).train()
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 6, (batch,))
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return 1 / statistics.median(times[1:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    cores = torch.get_num_threads()
    results = []
    for repeat in range(args.repeats):
        for hog in (False, True):
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
            try:
                time.sleep(0.5 if hog else 0)
                for threads in sorted({1, cores}):
                    r = {"repeat": repeat, "hog": hog, "threads": threads,
                         "steps_per_s": steps_per_s(threads, args.model, args.size, args.batch)}
                    print(r, flush=True)
                    results.append(r)
            finally:
                if proc:
                    proc.kill()
                    proc.wait()
    save_result("threads", {"machine": machine(), "args": vars(args), "results": results})
    print(f"\n{machine()}; {args.model} at {args.size} px, batch {args.batch}, training steps (median)")
    print("| other program | threads | steps/s (median of repeats) |\n|---|---|---|")
    for hog in (False, True):
        for threads in sorted({1, cores}):
            rs = [r["steps_per_s"] for r in results if r["hog"] == hog and r["threads"] == threads]
            print(f"| {'one spinning process' if hog else 'none'} | {threads} | {statistics.median(rs):.2f} |")


if __name__ == "__main__":
    main()

"""The speed benchmark suite: one command, every figure of the scale-and-speed work.

1. search modes on the fbnet_cifar10 space, synthetic 32x32 data (scripts/bench_modes.py):
   supernet step time vs the sum of its candidates' own forward+backward (overhead ratio),
   single_path / two_path speed-up and activation-memory ratio, activation checkpointing's
   memory ratio and step-time cost;
2. the data loader (the search's weight loader, CIFAR-sized: synthetic tensors, and an image
   folder of JPEGs that are decoded and augmented) vs what a full supernet weight step
   consumes, images/s, for 0 and 2 loader workers: the loader must never be the bottleneck
   (ratio > 1);
3. distributed: 2-process gloo DDP throughput vs 1 process, sync every step vs every 4
   (scripts/bench_ddp.py; quickstart space, since a CIFAR supernet step is slow on 2 cores);
4. mixed precision and channels_last: search and retrain step time and agreement with float32
   (scripts/bench_precision.py).

Medians over repeats, spread shown. Run on an idle machine:

    python scripts/bench.py                 # ~ 15 minutes on 2 cores
    python scripts/bench.py --quick         # a check that everything runs (figures meaningless)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def loader_vs_step(batch: int, steps: int, repeats: int) -> None:
    import torch
    import torch.nn.functional as F

    from fbnas.config import load_config
    from fbnas.data import DataConfig, build_search_data
    from fbnas.supernet import Supernet

    cfg = load_config(ROOT / "configs/fbnet_cifar10.yaml")
    m = cfg.space.macro
    torch.manual_seed(0)
    net = Supernet(cfg.space).train()
    opt = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, m.in_channels, *m.input_size)
    y = torch.randint(m.num_classes, (batch,))

    def step():
        with torch.no_grad():
            w = net.sample_weights(1.0)
        logits, _ = net(x, m=w)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    consume = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        consume.append(steps * batch / (time.perf_counter() - t))
    c = statistics.median(consume)
    print(f"full supernet weight step (fbnet_cifar10, batch {batch}): {c:.0f} images/s "
          f"(min {min(consume):.0f}, max {max(consume):.0f})")
    folder = _jpeg_folder(m.input_size, m.num_classes, 4096)
    for kind, workers in (("synthetic", 0), ("synthetic", 2), ("imagefolder", 0),
                          ("imagefolder", 2)):
        d = {"dataset": kind, "batch_size": batch, "workers": workers, "val_fraction": 0.1}
        d.update({"synthetic_size": 4096} if kind == "synthetic" else {"root": str(folder)})
        dc = DataConfig.from_dict(d, "bench")
        data = build_search_data(dc, m.input_size, m.in_channels, m.num_classes, seed=0)
        rates = []
        for r in range(repeats):
            data.set_epoch(r)
            n, t = 0, time.perf_counter()
            for xb, _ in data.w_loader:
                n += len(xb)
            rates.append(n / (time.perf_counter() - t))
        lr = statistics.median(rates)
        what = ("synthetic (no decoding)" if kind == "synthetic" else
                "image folder (JPEG decode + augmentation)")
        print(f"search weight loader, {workers} worker(s), {what}: {lr:.0f} img/s "
              f"(min {min(rates):.0f}, max {max(rates):.0f}); loader / step = x{lr / c:.1f}"
              + ("  <- the loader would be the bottleneck" if lr < c else ""))


def _jpeg_folder(size: tuple[int, int], classes: int, n: int) -> Path:
    """An ImageFolder tree (train/ and val/) of n random JPEGs of `size`, in a temp folder."""
    import tempfile

    import numpy as np
    from PIL import Image

    root = Path(tempfile.mkdtemp(prefix="fbnas-bench-jpeg-"))
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", max(classes, n // 10))):
        for i in range(count):
            d = root / split / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            px = rng.integers(0, 256, (size[0], size[1], 3), dtype=np.uint8)
            Image.fromarray(px).save(d / f"{i}.jpg", quality=90)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny settings: checks that it runs")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=("modes", "loader", "ddp", "precision"))
    ap.add_argument("--device", default="cpu", help="cpu or cuda (modes and precision)")
    args = ap.parse_args()
    py = sys.executable
    if "modes" not in args.skip:
        print("== 1. search modes and activation checkpointing (scripts/bench_modes.py)",
              flush=True)
        extra = ["--repeats", "2", "--layers", "3"] if args.quick else []
        subprocess.run([py, str(ROOT / "scripts/bench_modes.py"), "--device", args.device,
                        *extra], check=True)
    if "loader" not in args.skip:
        print("\n== 2. data loader vs step consumption", flush=True)
        loader_vs_step(32, 2 if args.quick else 3, 2 if args.quick else 3)
    if "ddp" not in args.skip:
        print("\n== 3. distributed data parallel, gloo on CPU (scripts/bench_ddp.py)", flush=True)
        extra = (["--steps", "4", "--warmup", "1", "--repeats", "1", "--samples", "512"]
                 if args.quick else [])
        subprocess.run([py, str(ROOT / "scripts/bench_ddp.py"), *extra], check=True,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if "precision" not in args.skip:
        print("\n== 4. mixed precision and channels_last (scripts/bench_precision.py)",
              flush=True)
        extra = ["--repeats", "1", "--layers", "3", "--batch", "8"] if args.quick else []
        subprocess.run([py, str(ROOT / "scripts/bench_precision.py"), "--device", args.device,
                        *extra], check=True)


if __name__ == "__main__":
    main()

"""The speed benchmark suite: one command, every figure of the scale-and-speed work.

1. search modes on the fbnet_cifar10 space, synthetic 32x32 data (scripts.speed.modes):
   supernet step time vs the sum of its candidates' own forward+backward (overhead ratio),
   single_path / two_path speed-up and activation-memory ratio, activation checkpointing's
   memory ratio and step-time cost;
2. the data loader (the search's weight loader, CIFAR-sized: synthetic tensors, and an image
   folder of JPEGs that are decoded and augmented) vs what a full supernet weight step
   consumes, images/s, for 0 and 2 loader workers: the loader must never be the bottleneck
   (ratio > 1);
3. distributed: 2-process gloo DDP throughput vs 1 process, sync every step vs every 4
   (scripts.speed.ddp; quickstart space, since a CIFAR supernet step is slow on 2 cores);
4. mixed precision and channels_last: search and retrain step time and agreement with float32
   (scripts.speed.precision).

Medians over repeats, spread shown. Run on an idle machine:

    python -m scripts.speed.suite          # ~ 15 minutes on 2 cores
    python -m scripts.speed.suite --quick  # a check that everything runs (figures meaningless)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from fbnas.data import DataConfig, build_search_data
from scripts.common import (
    ROOT,
    SPACES,
    Spread,
    closing,
    first_batch,
    interleave,
    run_config,
    search_trainer,
    synthetic_sets,
)


def loader_vs_step(config: str, batch: int, steps: int, repeats: int, size: int = 4096
                   ) -> None:
    """images/s a full-mode SearchTrainer.weight_step consumes on the config's space, against
    the search's weight loader (synthetic, and an image folder of `size` JPEGs) with 0 and 2
    workers."""
    with tempfile.TemporaryDirectory(prefix="fbnas-bench-") as tmp, closing([]) as trainers:
        cfg = run_config(config,
                         [*synthetic_sets(batch, 4 * batch, "cpu", Path(tmp) / "run"),
                          "search.mode=full", "search.seed=0"])
        t = search_trainer(cfg)
        trainers.append(t)
        x, y = first_batch(t)
        times = interleave({"step": lambda: [t.weight_step(x, y) for _ in range(steps)]},
                           repeats, warmup=1)
    consume = Spread.of([steps * batch / s for s in times["step"]])
    c = consume.median
    print(f"full supernet weight step ({cfg.space.name}, batch {batch}): {c:.0f} images/s "
          f"(min {consume.lo:.0f}, max {consume.hi:.0f})")
    m = cfg.space.macro
    folder = _jpeg_folder(m.input_size, m.num_classes, size)
    try:
        loaders(folder, cfg, batch, repeats, size, c)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def loaders(folder: Path, cfg, batch: int, repeats: int, size: int, c: float) -> None:
    m = cfg.space.macro
    for kind, workers in (("synthetic", 0), ("synthetic", 2), ("imagefolder", 0),
                          ("imagefolder", 2)):
        d = {"dataset": kind, "batch_size": batch, "workers": workers, "val_fraction": 0.1}
        d.update({"synthetic_size": size} if kind == "synthetic" else {"root": str(folder)})
        dc = DataConfig.from_dict(d, "bench")
        data = build_search_data(dc, m.input_size, m.in_channels, m.num_classes, seed=0)
        rates = []
        for r in range(repeats):
            data.set_epoch(r)
            t0 = time.perf_counter()
            n = sum(len(xb) for xb, _ in data.w_loader)
            rates.append(n / (time.perf_counter() - t0))
        lr = Spread.of(rates)
        what = ("synthetic (no decoding)" if kind == "synthetic" else
                "image folder (JPEG decode + augmentation)")
        print(f"search weight loader, {workers} worker(s), {what}: {lr.median:.0f} img/s "
              f"(min {lr.lo:.0f}, max {lr.hi:.0f}); loader / step = x{lr.median / c:.1f}"
              + ("  <- the loader would be the bottleneck" if lr.median < c else ""))


def _jpeg_folder(size: tuple[int, int], classes: int, n: int) -> Path:
    """An ImageFolder tree (train/ and val/) of n random JPEGs of `size`, in a temp folder."""
    root = Path(tempfile.mkdtemp(prefix="fbnas-bench-jpeg-"))
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", max(classes, n // 10))):
        for i in range(count):
            d = root / split / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            px = rng.integers(0, 256, (size[0], size[1], 3), dtype=np.uint8)
            Image.fromarray(px).save(d / f"{i}.jpg", quality=90)
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny settings: checks that it runs")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=("modes", "loader", "ddp", "precision"))
    ap.add_argument("--device", default="cpu", help="cpu or cuda (modes and precision)")
    ap.add_argument("--config", default=str(SPACES["fbnet_cifar10"]),
                    help="the space of the modes, loader and precision parts")
    args = ap.parse_args(argv)
    q = args.quick
    small = ["--layers", "3", "--batch", "8"]
    parts = {"modes": ("1. search modes and activation checkpointing", "speed.modes",
                       ["--config", args.config, "--device", args.device,
                        *(["--repeats", "2", *small] if q else [])]),
             "loader": ("2. data loader vs step consumption", None, []),
             # quick: sync every 4 rounds the warm-up and timed steps up to 4 each, 8 weight
             # batches of 32 per process (512 images gave 5: refused)
             "ddp": ("3. distributed data parallel, gloo on CPU", "speed.ddp",
                     ["--steps", "4", "--warmup", "1", "--repeats", "1", "--samples", "1024"]
                     if q else []),
             "precision": ("4. mixed precision and channels_last", "speed.precision",
                           ["--config", args.config, "--device", args.device,
                            *(["--repeats", "1", *small] if q else [])])}
    for key, (title, module, extra) in parts.items():
        if key in args.skip:
            continue
        print(f"\n== {title}" + (f" (scripts.{module})" if module else ""), flush=True)
        if module is None:
            loader_vs_step(args.config, 32, 2 if q else 3, 2 if q else 3, 512 if q else 4096)
            continue
        subprocess.run([sys.executable, "-m", f"scripts.{module}", *extra], check=True,
                       cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"} if key == "ddp"
                       else None)


if __name__ == "__main__":
    main()

"""Search epochs end to end (data path, steps, validation) per fbnas checkout, side by side.

The small-supernet figure: a quickstart-size supernet (6 layers x 7 ops) on 28x28 grey
images, images/s over whole search epochs, where per-kernel launches, host reads and the data
loader (not arithmetic) set the pace. Each --code checkout runs `SearchTrainer.train` in its own
process, whose PYTHONPATH names that checkout (alternating, --repeats times, so drift hits all
alike) on the same config; printed
per checkout: each θ-active epoch's seconds and images/s (weight + θ steps x batch / epoch
seconds), the median, and its ratio to the first checkout's.

The same config for every checkout, one that each can read: by default only the `space:` of
this checkout's configs/quickstart.yaml, with the sizes below (28x28 grey synthetic images,
--size, --batch, --epochs, one warm-up epoch, the FLOPs cost); every other setting is the
checkout's own default (search.mode full, separate weights), since the quickstart's search
section (search.mode: reinforce, weights: shared, ...) is refused by a checkout older than
those keys. `--config FILE` gives every checkout FILE instead (the sizes still applied), and
`--set` adds overrides: a checkout that cannot read them fails with its own error.

    git worktree add /tmp/base e4987fe         # fbnas before the supernet's speed-ups
    python -m scripts.speed.search_epochs --code /tmp/base --code .     # on a GPU
    python -m scripts.speed.search_epochs --code . --device cpu --size 2000 --epochs 2

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from fbnas.io import load_yaml
from scripts.common import QUIET, ROOT, SPACES, Spread, alternate, with_code

DRIVER = """
import json, sys
from fbnas.config import load_config
from fbnas.trainer import SearchTrainer
cfg = load_config(sys.argv[1], sys.argv[3:])
t = SearchTrainer(cfg, cfg.run.dir)
try:
    (t.train if hasattr(t, "train") else t.fit)()  # checkouts before the rename call it fit
finally:  # the trainer's log files closed; no fbnas name for it (checkouts differ)
    for h in list(t.log.handlers):
        h.close()
        t.log.removeHandler(h)
steps = len(t.data.w_loader) + len(t.data.theta_loader)
json.dump({"seconds": [h["seconds"] for h in t.history],
           "theta": [bool(h.get("theta_active")) for h in t.history],
           "images": steps * cfg.data.batch_size, "device": str(t.device)}, open(sys.argv[2], "w"))
"""


def run(code: Path, config: Path, args, work: Path, tag: str) -> dict:
    out = work / f"{tag}.json"
    sets = [f"space.input_size={args.input_size}", "space.in_channels=1",
            "data.dataset=synthetic", f"data.synthetic_size={args.size}",
            f"data.batch_size={args.batch}", f"search.epochs={args.epochs}",
            "search.warmup_epochs=1", f"search.device={args.device}", "latency.cost=flops",
            *QUIET, f"run.dir={work / tag}", *args.set]
    r = subprocess.run([sys.executable, "-c", DRIVER, str(config), str(out), *sets],
                       env=with_code(code), cwd=code, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{code}: the search failed:\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", action="append", default=[], metavar="DIR",
                    help="an fbnas checkout (repeat; the first is the reference)")
    ap.add_argument("--config", help="one config file for every checkout (default: only the "
                    "space of configs/quickstart.yaml, every other setting the checkout's default)")
    ap.add_argument("--input-size", type=int, default=28)
    ap.add_argument("--size", type=int, default=60000, help="synthetic images in all")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3, help="the first is weights only")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = ap.parse_args(argv)
    codes = [Path(c).resolve() for c in (args.code or [str(ROOT)])]
    per: dict[Path, list[float]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory(prefix="fbnas_bench_epochs_") as tmp:
        if args.config:
            config = Path(args.config).resolve()  # each checkout runs in its own folder
            print(f"config {config} for every checkout", flush=True)
        else:
            config = Path(tmp) / "space.yaml"
            config.write_text(yaml.safe_dump({"space": load_yaml(SPACES["quickstart"])["space"]},
                                             sort_keys=False))
            print(f"config: the space of {SPACES['quickstart']}, every other setting each "
                  "checkout's default (search.mode full in every checkout so far)", flush=True)
        print(f"{args.input_size}x{args.input_size} grey synthetic images, {args.size} in all, "
              f"batch {args.batch}, {args.epochs} epochs (the first weights only), FLOPs cost"
              + (f"; --set {' '.join(args.set)}" if args.set else ""), flush=True)
        for rep in range(args.repeats):
            for c in alternate(codes, rep):
                res = run(c, config, args, Path(tmp), f"r{rep}_{codes.index(c)}")
                rates = [res["images"] / s for s, th in zip(res["seconds"], res["theta"],
                                                            strict=True) if th]
                per[c] += rates
                print(f"repeat {rep + 1}, {c} on {res['device']}: θ epochs "
                      + ", ".join(f"{s:.2f} s" for s, th in zip(res["seconds"], res["theta"],
                                                                 strict=True) if th)
                      + f" ({res['images']} images each)", flush=True)
    ref = Spread.of(per[codes[0]]).median
    print(f"\n{'checkout':<50}{'images/s median (min-max)':>30}{'x first':>9}")
    for c in codes:
        r = Spread.of(per[c])
        print(f"{str(c):<50}{r.range('.0f'):>30}{r.median / ref:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

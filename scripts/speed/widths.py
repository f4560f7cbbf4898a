"""What does searching widths cost per step, and how large is its latency table?

Step time: one weight step + one θ step of a SearchTrainer (the library's own steps; synthetic
data, the FLOPs cost, θ active) on the width-searched space of --config and on the same space
with its `widths` removed, for every search mode, all variants timed once per round in
alternating order; reported: median (min-max) over rounds and the ratio of medians
(with / without widths), per mode.
Activation memory: bytes of the distinct storages autograd saves for backward during one θ
step's forward (scripts.common.SavedBytes; deterministic), mean over --mem-samples sampled
paths in the sampled modes.
Table: the number of entries (signatures) the space needs with and without its widths, and
for --table-config (default the FBNetV2 ImageNet config) the same against the op-only FBNet
ImageNet space.

    python -m scripts.speed.widths                       # configs/quickstart_widths.yaml
    python -m scripts.speed.widths --repeats 3 --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch

from fbnas.latency.signature import space_signatures
from fbnas.search.modes import MODES
from fbnas.search_space import SearchSpace
from fbnas.trainer import frozen_weights
from scripts.common import (
    ROOT,
    SavedBytes,
    Spread,
    closing,
    configured_mode,
    first_batch,
    interleave,
    run_config,
    search_step,
    search_trainer,
    synthetic_sets,
)

MIB = 2.0**20


def without_widths(space: SearchSpace) -> SearchSpace:
    """The same space with every stage at its widest, nothing searched."""
    d = space.to_dict()
    for st in d["stages"]:
        st.pop("widths", None)
    d.pop("width_divisor", None)
    d["name"] = f"{space.name}-opsonly"
    return SearchSpace.from_dict(d, "without widths")


def activations(t, x, y, draws: int, seed: int) -> float:
    """Mean MiB saved for backward by a θ step's forward over `draws` sampled paths (the
    weights frozen, as `SearchTrainer.theta_step` runs it; `reinforce` scores paths without a
    gradient: nothing)."""
    out = []
    for k in range(1 if t.net.mode == "full" else draws):
        torch.manual_seed(seed + k)
        p = t.net.sample_path(t.tau, t.cfg.search.hard)
        scored = torch.no_grad() if t.net.search_mode.score_paths else nullcontext()
        with frozen_weights(t.net.weight_parameters()), scored, SavedBytes(t.net) as meter:
            logits, cost = t.net(x, m=p.m, active=p.active, cost_m=p.cost_m)
            t.loss(logits, y, cost)
        out.append(meter.total() / MIB)
    return statistics.mean(out)


def table_sizes(paths: list[str]) -> None:
    for p in paths:
        space = run_config(p).space
        n = len(space_signatures(space))
        base = len(space_signatures(without_widths(space)))
        print(f"table of {space.name}: {n} entries, {base} without its widths "
              f"({n / base:.2f}x)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "quickstart_widths.yaml"))
    ap.add_argument("--modes", default=",".join(MODES.choices()))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mem-samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--table-config", default=",".join(
        str(ROOT / "configs" / f"{n}.yaml") for n in ("fbnetv2_imagenet", "fbnet_imagenet")))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    widths = run_config(a.config).space
    if not widths.searches_widths:
        raise SystemExit(f"{a.config}: its space searches no widths")
    spaces = {"widths": widths, "ops only": without_widths(widths)}
    modes = a.modes.split(",")
    print(f"== {widths.name}: {widths.size():.3g} architectures with widths, "
          f"{spaces['ops only'].size():.3g} without; batch {a.batch}, {a.threads} thread(s)")
    with tempfile.TemporaryDirectory(prefix="fbnas-bench-widths-") as tmp, \
            closing({}) as trainers:
        for mode in modes:
            for label, space in spaces.items():
                sets = [*synthetic_sets(a.batch, 4 * a.batch, "cpu",
                                        Path(tmp) / f"{mode}-{label}"),
                        f"search.mode={configured_mode(mode)}", "data.val_fraction=0",
                        "search.weights=shared"]
                trainers[(mode, label)] = search_trainer(run_config(a.config, sets, space),
                                                         sampler=mode)
        x, y = first_batch(trainers[(modes[0], "widths")])
        mem = {k: activations(t, x, y, a.mem_samples, 0) for k, t in trainers.items()}
        jobs = {k: (lambda t=t: search_step(t, x, y)) for k, t in trainers.items()}
        times = interleave(jobs, a.repeats, "cpu", warmup=1)
    print(f"{'mode':12s} {'step ms, widths':>24s} {'ops only':>24s} {'ratio':>6s} "
          f"{'act MiB':>8s} {'ops only':>8s} {'ratio':>6s}")
    for mode in modes:
        w, o = Spread.of(times[(mode, "widths")]), Spread.of(times[(mode, "ops only")])
        mw, mo = mem[(mode, "widths")], mem[(mode, "ops only")]
        print(f"{mode:12s} {w.range('.1f', 1e3):>24s} {o.range('.1f', 1e3):>24s} "
              f"{w.median / o.median:6.2f} {mw:8.2f} {mo:8.2f} "
              f"{format(mw / mo, '6.2f') if mo > 0 else '     -'}")
    table_sizes([p for p in a.table_config.split(",") if p])


if __name__ == "__main__":
    main()

"""Search modes side by side: step time and activation memory of full, single_path and
two_path, full with and without checkpoint_activations, and the supernet overhead ratio.

What is measured (synthetic input, the space of --config, optionally cut to --layers
searchable layers, see scripts.common.truncated()):

  step time      one weight step + one θ step of a SearchTrainer per variant
                 (SearchTrainer.weight_step / theta_step: the library's own update, with its
                 non-finite check, loss scaling and gradient clipping; synthetic data, the
                 FLOPs cost, θ active). Each round times every variant once, in forward order
                 on even rounds and reverse order on odd ones, so machine drift hits all
                 alike; reported: median and min-max over rounds, and ratios of medians.
  activations    bytes of the distinct tensor storages autograd saves for backward during one
                 forward (torch.autograd.graph.saved_tensors_hooks; parameters and buffers
                 excluded): deterministic and device-independent. For a plain forward every
                 saved tensor is alive at the end of it, so this is the activation peak. With
                 checkpoint_activations the layers' own saves go to the checkpoint instead and
                 are dropped: what is held is the outer saves (stem, head) plus each
                 checkpointed layer's input; during backward one layer at a time is recomputed,
                 so the reported peak is held + the largest layer's saves (excluding its input,
                 counted already). single_path / two_path depend on the sampled candidates:
                 mean [min-max] over --mem-samples draws. Gradients, optimizer state and
                 backward temporaries are not included. On CUDA the allocator's peak
                 (max_memory_allocated minus what was allocated before the step) of one
                 weight + θ step is printed as well.
  overhead ratio (supernet forward+backward, full mode, m without grad as in a weight step,
                 CE loss) / (sum over parts of each part's own forward+backward: the stem on
                 the input, every candidate block of every layer on a random input of that
                 layer's shape (requires_grad, as the supernet needs input gradients), the head
                 on a random input of its shape; backward of out.sum()). Both are timed in the
                 same rounds, parts in alternating order; the ratio is taken per round.

    python -m scripts.speed.modes                       # fbnet_cifar10, batch 32, CPU
    python -m scripts.speed.modes --repeats 2 --layers 3   # a quick check that it works
    python -m scripts.speed.modes --device cuda --batch 128
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from fbnas.trainer import frozen_weights
from scripts.common import (
    SPACES,
    Parts,
    SavedBytes,
    Spread,
    closing,
    configured_mode,
    first_batch,
    interleave,
    run_config,
    search_step,
    search_trainer,
    supernet_fwd_bwd,
    sync,
    synthetic_sets,
    truncated,
)

# (label, search.mode, checkpoint_activations)
VARIANTS = [("full", "full", False), ("single_path", "single_path", False),
            ("two_path", "two_path", False), ("full+ckpt", "full", True)]
MIB = 2.0**20


def saved_bytes(t, x, y, p, ckpt: bool) -> tuple[int, int]:
    """(held at the end of the forward, peak during backward) in bytes, for the trainer's
    supernet on the path `p`, with checkpoint_activations `ckpt`."""
    net = t.net

    def forward(checkpointed: bool) -> SavedBytes:
        net.checkpoint_activations = checkpointed
        with SavedBytes(net) as meter:
            logits, cost = net(x, m=p.m, active=p.active, cost_m=p.cost_m)
            t.loss(logits, y, cost)
        return meter

    try:
        plain = forward(False)
        if not ckpt:
            return plain.total(), plain.total()
        meter = forward(True)
    finally:
        net.checkpoint_activations = ckpt
    held_inputs = {k: b for k, b in meter.inputs.values() if k not in meter.owner}
    held = meter.total() + sum(held_inputs.values())
    # recomputing layer l in backward re-creates its saves (its input is held already)
    recompute = max(plain.by_layer[li] - (b if plain.owner.get(k, -1) == li else 0)
                    for li, (k, b) in plain.inputs.items())
    return held, held + recompute


def memory(trainers, x, y, draws: int, seed: int) -> dict[str, dict[str, tuple]]:
    """Per variant, θ-step and weight-step activation peaks (mean, min, max over draws; with
    checkpointing also what is held after the forward), printed as they come."""
    print("\n-- activations saved for backward (MiB); θ step (m requires grad, the weights "
          "frozen) and weight step (m without grad)")
    mem = {}
    for label, mode, ckpt in VARIANTS:
        t = trainers[label]
        n = 1 if mode == "full" else draws
        row = {}
        for step in ("theta", "w"):
            held, peak = [], []
            for k in range(n):
                torch.manual_seed(seed + 1000 + k)
                with torch.set_grad_enabled(step == "theta"):
                    p = t.net.sample_path(t.tau, t.cfg.search.hard)
                # a θ step runs with the weights frozen (SearchTrainer.theta_step)
                with frozen_weights(t.net.weight_parameters()) if step == "theta" \
                        else nullcontext():
                    a, b = saved_bytes(t, x, y, p, ckpt)
                held.append(a / MIB)
                peak.append(b / MIB)
            row[step] = (statistics.mean(peak), min(peak), max(peak))
            if ckpt:
                row[step + "_held"] = (statistics.mean(held), min(held), max(held))
        mem[label] = row
        extra = (f"  (held after forward: θ {row['theta_held'][0]:.1f}, w {row['w_held'][0]:.1f};"
                 " peak = held + largest recomputed layer)" if ckpt else "")
        rng = "" if n == 1 else f" [{row['theta'][1]:.1f}-{row['theta'][2]:.1f}]"
        print(f"{label:12s} θ step {row['theta'][0]:8.1f}{rng}  w step {row['w'][0]:8.1f}"
              f"{extra}", flush=True)
    return mem


def cuda_peaks(trainers, x, y, dev: torch.device) -> None:
    print("-- CUDA allocator peak of one weight + θ step (MiB, above what was allocated)")
    for label, _, _ in VARIANTS:
        search_step(trainers[label], x, y)  # optimizer state exists before measuring
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        search_step(trainers[label], x, y)
        sync(dev)
        print(f"{label:12s} {(torch.cuda.max_memory_allocated(dev) - base) / MIB:8.1f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["fbnet_cifar10"]))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=0,
                    help="only N searchable layers (0: all; see truncated())")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (at most)")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds for the whole run: fewer timed rounds (not below 3) if the "
                         "warm-up round says they won't fit")
    ap.add_argument("--mem-samples", type=int, default=3,
                    help="sampled paths averaged for single_path/two_path memory")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    full_space = run_config(args.config).space
    space, how = truncated(full_space, args.layers)
    with tempfile.TemporaryDirectory(prefix="fbnas-bench-modes-") as tmp, \
            closing({}) as trainers:
        for label, mode, ckpt in VARIANTS:
            sets = [*synthetic_sets(args.batch, 4 * args.batch, args.device, Path(tmp) / label),
                    f"search.mode={configured_mode(mode)}",
                    f"search.checkpoint_activations={str(ckpt).lower()}",
                    f"search.seed={args.seed}", "data.val_fraction=0"]
            trainers[label] = search_trainer(run_config(args.config, sets, space),
                                             sampler=mode)
        x, y = first_batch(trainers["full"])
        run(args, trainers, x, y, space, how, full_space, t_start)


def run(args, trainers, x, y, space, how, full_space, t_start: float) -> None:
    dev = torch.device(args.device)
    cands = space.layer_candidates()
    h, w = space.macro.input_size
    n_layers = len(cands)
    note = ("" if space is full_space else
            f" -- ONLY {n_layers} OF {full_space.num_layers} SEARCHABLE LAYERS (--layers)")
    print(f"== search modes: {space.name}, {n_layers} searchable layers x "
          f"{'/'.join(sorted({str(len(c)) for c in cands}))} candidates, batch {args.batch}, "
          f"{h}x{w}, {dev}, {args.threads} thread(s), synthetic data{note}", flush=True)
    if how:
        print(f"   --layers {args.layers}: {how}; figures are for this smaller network")
    mem = memory(trainers, x, y, args.mem_samples, args.seed)
    if dev.type == "cuda":
        cuda_peaks(trainers, x, y, dev)

    # ---- time ---------------------------------------------------------------------------------
    net = trainers["full"].net
    parts = Parts(net, space, x)
    jobs = {label: (lambda t=trainers[label]: search_step(t, x, y)) for label, _, _ in VARIANTS}
    jobs["supernet fwd+bwd"] = lambda: supernet_fwd_bwd(net, x, y, trainers["full"].tau)
    jobs["sum of parts"] = parts
    t_warm = time.perf_counter()
    interleave(jobs, 0, dev, warmup=1)  # warm-up (allocator, optimizer state, kernels)
    warm = time.perf_counter() - t_warm
    left = args.budget - (time.perf_counter() - t_start)
    rounds = args.repeats
    if warm * rounds > left:
        rounds = max(min(3, args.repeats), int(left / warm))
        if rounds < args.repeats:
            print(f"\n(note: the warm-up round took {warm:.1f}s: {rounds} of --repeats "
                  f"{args.repeats} rounds fit --budget {args.budget:.0f}s"
                  + ("; consider --layers" if warm * rounds > left else "") + ")")
    print(f"\n-- time per round (s): {rounds} rounds after one warm-up round, alternating order",
          flush=True)
    times = interleave(jobs, rounds, dev, on_round=lambda r, res: print(
        f"round {r + 1}: " + ", ".join(f"{n} {res[n]:.3f}" for n in jobs), flush=True))
    overhead = [a / b for a, b in zip(times["supernet fwd+bwd"], times["sum of parts"],
                                      strict=True)]

    print("\n-- step time, weight step + θ step (s): median [min-max]")
    for n in jobs:
        s = Spread.of(times[n])
        print(f"{n:17s} {s.median:8.3f} [{s.lo:.3f}-{s.hi:.3f}]")
    med = {n: statistics.median(times[n]) for n in jobs}
    print("\n-- ratios (of medians; memory: θ-step activations, mean over draws)")
    full_mem = mem["full"]["theta"][0]
    for n in ("single_path", "two_path"):
        print(f"{n + ' speed-up over full:':32s} {med['full'] / med[n]:6.2f}x   activation "
              f"memory {mem[n]['theta'][0] / full_mem:.3f} of full")
    print(f"checkpointing (full+ckpt / full): step time {med['full+ckpt'] / med['full']:.3f}x, "
          f"activation peak {mem['full+ckpt']['theta'][0] / full_mem:.3f} "
          f"(held after forward {mem['full+ckpt']['theta_held'][0] / full_mem:.3f}); weight "
          f"step peak {mem['full+ckpt']['w'][0] / mem['full']['w'][0]:.3f}")
    print(f"supernet overhead ratio (full fwd+bwd / sum of its parts' fwd+bwd): median "
          f"{Spread.of(overhead).iqr()}, {rounds} rounds; "
          f"{parts.blocks} candidate blocks + stem + head")
    print(f"total {time.perf_counter() - t_start:.0f}s{note}")


if __name__ == "__main__":
    main()

"""How much of the cross-entropy reaches θ in each search mode, layer by layer.

The θ gradient of a sampled mode approximates full's; where the approximation is blind the
cost term alone moves θ and the search collapses to the cheapest op. This prints, for each
mode whose θ gradient flows through the relaxation (fbnas.search.modes; not the scored ones) and
searchable layer, the mean norm of ∂CE/∂θ_l (no cost term) over --draws path draws,
on scikit-learn's digits in the config's space (pixels / 16, bilinearly upsampled to the
input size; not normalised or padded as fbnas's digits loader does).

First the weights are trained for --warm-steps full-mode weight steps (SGD, lr 0.1), so the
CE is informative; then every mode is evaluated on the same weights and batches. With
--plain-mixture the shared shortcut of shape-keeping layers is switched off (Σ m_i b_i(x),
as before fbnas factored it out), to show what it changes in single_path.

With --weight-curve N it also trains fresh weights for N weight steps in each mode (paths
drawn as that mode's weight steps draw them, θ uniform, τ = 5) and prints the mean CE per
window of N/5 steps: how fast a mode's shared weights learn at all.

    python -m scripts.search.theta_signal                      # configs/quickstart.yaml
    python -m scripts.search.theta_signal --plain-mixture
    python -m scripts.search.theta_signal --weight-curve 1500
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from fbnas.data.sources import bundled_digits
from fbnas.search.modes import MODES, get_mode
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet
from scripts.common import SPACES, run_config

# the modes whose θ gradient is the relaxation's (a scored mode's comes from the score function)
RELAXED = [m for m in MODES.choices() if not get_mode(m).score_paths]


def digits(size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    images, target = bundled_digits()  # pixels / 16
    x = torch.from_numpy(images).unsqueeze(1)
    if size != (8, 8):
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return x, torch.from_numpy(target)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--warm-steps", type=int, default=100)
    ap.add_argument("--draws", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tau", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plain-mixture", action="store_true",
                    help="no shared shortcut: every layer mixes Σ m_i b_i(x)")
    ap.add_argument("--weight-curve", type=int, default=0, metavar="N",
                    help="also train fresh weights N steps per mode and print CE per window")
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    space = run_config(a.config).space
    if space.macro.in_channels != 1 or space.macro.num_classes != 10:
        raise SystemExit(f"{a.config}: space must take 1-channel input and 10 classes "
                         "(the digits data)")
    x_all, y_all = digits(tuple(space.macro.input_size))
    net = make_net(space, "full", a.plain_mixture)
    train_weights(net, x_all, y_all, a.warm_steps, a.batch)
    batches = [torch.randint(0, len(x_all), (a.batch,)) for _ in range(a.draws)]
    shared = [op.shortcut for op in net.mixed]
    print(f"{a.config}: {len(net.mixed)} layers, shared shortcut "
          f"{''.join('S' if s else '.' for s in shared)}, {a.warm_steps} warm-up steps, "
          f"{a.draws} draws, τ = {a.tau}{', plain mixture' if a.plain_mixture else ''}")
    print("mean ‖∂CE/∂θ_l‖ per layer (and / full):")
    ref = None
    for mode in RELAXED:
        net.mode = mode
        torch.manual_seed(a.seed + 1)
        norms = [[] for _ in net.theta]
        for idx in batches:
            p = net.sample_path(a.tau)
            logits, _ = net(x_all[idx], m=p.m, active=p.active, cost_m=p.cost_m)
            grads = torch.autograd.grad(F.cross_entropy(logits, y_all[idx]), net.theta,
                                        allow_unused=True)
            for li, g in enumerate(grads):
                norms[li].append(0.0 if g is None else float(g.norm()))
        mean = [statistics.fmean(n) for n in norms]
        ref = mean if ref is None else ref
        cells = "  ".join(f"{v:8.1e}" + ("" if mode == "full" else f" ({v / r:5.3f})")
                          for v, r in zip(mean, ref, strict=True))
        print(f"  {mode:<12} {cells}")
    if a.weight_curve:
        window = max(1, a.weight_curve // 5)
        print(f"weight training from scratch, {a.weight_curve} steps (SGD lr 0.1, momentum 0.9,"
              f" batch {a.batch}): mean CE per {window} steps")
        for mode in RELAXED:
            torch.manual_seed(a.seed)
            ces = train_weights(make_net(space, mode, a.plain_mixture), x_all, y_all,
                                a.weight_curve, a.batch)
            means = [statistics.fmean(ces[i:i + window]) for i in range(0, len(ces), window)]
            print(f"  {mode:<12} " + "  ".join(f"{v:6.3f}" for v in means))


def make_net(space: SearchSpace, mode: str, plain: bool) -> Supernet:
    net = Supernet(space, mode=mode)
    if plain:
        for op in net.mixed:
            op.shortcut = False
    return net


def train_weights(net: Supernet, x_all: torch.Tensor, y_all: torch.Tensor, steps: int,
                  batch: int) -> list[float]:
    """`steps` weight steps in the net's mode (θ untouched, τ = 5): the CE of each."""
    opt = torch.optim.SGD(net.weight_parameters(), lr=0.1, momentum=0.9)
    ces = []
    for _ in range(steps):
        idx = torch.randint(0, len(x_all), (batch,))
        with torch.no_grad():
            p = net.sample_path(5.0)
        logits, _ = net(x_all[idx], m=p.m, active=p.active, cost_m=p.cost_m)
        loss = F.cross_entropy(logits, y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ces.append(loss.item())
    return ces


if __name__ == "__main__":
    main()

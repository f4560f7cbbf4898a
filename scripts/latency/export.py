"""How closely exported child networks reproduce the eager model: the measurement behind each
export format's tolerance (`Format.tolerance`, fbnas.backends).

    python -m scripts.latency.export                    # quickstart space, 5 archs, 64 inputs
    python -m scripts.latency.export --n-archs 10 --config configs/fbnet_cifar10.yaml
    python -m scripts.latency.export --formats torchscript,pt2   # only these formats

For each of N random architectures of the space (random op per layer), a child network with
random weights and perturbed BatchNorm statistics and affine parameters (so BN is not the
identity and folding it matters), in eval mode, is exported to every format (TorchScript,
ONNX, .pt2, .pte; no verification) and run on the same 64 N(0, 1) inputs as the eager model.
Prints max abs and max rel diff (fbnas.backends.export.check_equivalence's definitions) per arch and
format, then the median and max over the archs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from fbnas.arch import arch_from_indices, build_child
from fbnas.backends import FORMATS
from fbnas.backends.export import check_equivalence, export_child
from scripts.common import SPACES, Spread, run_config


def perturb(net: torch.nn.Module, g: torch.Generator) -> None:
    """Random BN statistics and affine parameters, and a classifier of the usual nn.Linear
    scale (init_weights' N(0, 0.01) makes logits ~1e-2), so outputs are non-trivial."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)
            elif isinstance(m, torch.nn.Linear):
                bound = m.in_features ** -0.5
                m.weight.copy_((torch.rand(m.weight.shape, generator=g) * 2 - 1) * bound)
                m.bias.copy_((torch.rand(m.bias.shape, generator=g) * 2 - 1) * bound)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--n-archs", type=int, default=5)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--formats", default=",".join(FORMATS.choices()),
                    help="comma-separated export formats (default: every registered one)")
    args = ap.parse_args(argv)
    formats = [FORMATS.get(f) for f in args.formats.split(",")]

    space = run_config(args.config).space
    g = torch.Generator().manual_seed(args.seed)
    cands = space.layer_candidates()
    results: dict[str, list[dict]] = {f.name: [] for f in formats}
    print(f"space {space.name}: {space.num_layers} layers, input "
          f"{space.macro.in_channels}x{space.macro.input_size[0]}x{space.macro.input_size[1]}, "
          f"{args.inputs} inputs, torch {torch.__version__}, threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.n_archs):
            idx = [int(torch.randint(len(c), (1,), generator=g)) for c in cands]
            arch = arch_from_indices(space, idx, f"bench_{i}")
            torch.manual_seed(args.seed * 1000 + i)
            net = build_child(arch)
            perturb(net, g)
            net.eval()
            x = torch.randn(args.inputs, space.macro.in_channels, *space.macro.input_size,
                            generator=g)
            with torch.no_grad():
                logit_max = float(net(x).abs().max())
            line = [f"arch {i} [{arch.short_hash}] |logits| max {logit_max:.3g}"]
            for f in formats:
                fmt = f.name
                out = Path(tmp) / f"a{i}{f.suffix}"
                t0 = time.perf_counter()
                # a .pte has a static batch: export it for the whole input batch
                rec = export_child(net, arch, fmt, out, verify=False,
                                   batch=x.shape[0] if fmt == "pte" else 1)
                dt = time.perf_counter() - t0
                r = check_equivalence(net, out, fmt, x)
                r["export_s"] = dt
                results[fmt].append(r)
                line.append(f"{fmt}: abs {r['max_abs_diff']:.3g} rel {r['max_rel_diff']:.3g} "
                            f"argmax {r['argmax_agreement']:.0%} ok={r['ok']} "
                            f"({rec['method']}, {dt:.1f} s)")
            print("  ".join(line))
            print(f"  ops: {' '.join(arch.ops)}")
    print()
    for f in formats:
        rs = results[f.name]
        a = Spread.of([r["max_abs_diff"] for r in rs])
        rel = Spread.of([r["max_rel_diff"] for r in rs])
        agree = min(r["argmax_agreement"] for r in rs)
        rtol, atol = f.tolerance
        print(f"{f.name:12s} max abs diff: median {a.median:.3g}  max {a.hi:.3g}   "
              f"max rel diff: median {rel.median:.3g}  max {rel.hi:.3g}   "
              f"argmax agreement min {agree:.0%}   (tolerance rtol {rtol:g} atol {atol:g}, "
              f"all ok: {all(r['ok'] for r in rs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

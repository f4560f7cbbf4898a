"""Child training throughput, eager vs torch.compile, measured side by side.

Trains the same child (default: the all-ir_k5_e6 network of the quickstart space, batch 64,
digits-sized 1x16x16 inputs, SGD, label smoothing — what `fbnas retrain` runs) in alternating
timed blocks of steps, eager and compiled, so a slow spell of the machine hits both alike;
reports images/s of each per block and the median ratio with its spread. Compilation time is
reported separately (it is paid once per run).

    python scripts/bench_compile.py                 # ~ 3 minutes on 2 cores
    python scripts/bench_compile.py --blocks 10 --steps 30 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--op", default="ir_k5_e6", help="uniform op of the child")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="training steps per timed block")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from fbnas.arch import arch_from_indices, build_child
    from fbnas.config import load_config

    cfg = load_config(args.config)
    space = cfg.space
    arch = arch_from_indices(space, [c.index(args.op) for c in space.layer_candidates()],
                             f"all_{args.op}")
    m = space.macro
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, m.in_channels, *m.input_size, generator=g)
    y = torch.randint(m.num_classes, (args.batch,), generator=g)

    def setup(compiled: bool):
        torch.manual_seed(0)
        net = build_child(arch).train()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        fwd = torch.compile(net, mode=args.mode) if compiled else net

        def step():
            loss = F.cross_entropy(fwd(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss
        return step

    eager = setup(False)
    t = time.perf_counter()
    try:
        comp = setup(True)
        comp()  # compile: forward and backward graphs
        comp()
    except Exception as e:  # no compiler, unsupported op, ...
        print(f"torch.compile does not work here: {type(e).__name__}: "
              f"{str(e).strip().splitlines()[0][:200]}")
        return
    compile_s = time.perf_counter() - t
    for _ in range(3):
        eager()
        comp()
    rates = {"eager": [], "compiled": []}
    for b in range(args.blocks):
        order = ("eager", "compiled") if b % 2 == 0 else ("compiled", "eager")
        for name in order:
            fn = eager if name == "eager" else comp
            t = time.perf_counter()
            for _ in range(args.steps):
                fn()
            rates[name].append(args.steps * args.batch / (time.perf_counter() - t))
    ratios = [c / e for c, e in zip(rates["compiled"], rates["eager"], strict=True)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"child {arch.name} [{arch.short_hash}], batch {args.batch}, {args.threads} thread(s),"
          f" torch {torch.__version__}, compile mode {args.mode}")
    for name, r in rates.items():
        print(f"{name:<9} images/s: median {statistics.median(r):8.0f}  "
              f"(min {min(r):.0f}, max {max(r):.0f}, {len(r)} blocks of {args.steps} steps)")
    print(f"compiled / eager throughput: median x{statistics.median(ratios):.2f} "
          f"(IQR {q[0]:.2f}-{q[2]:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f})")
    print(f"compile time (first two steps): {compile_s:.1f} s")


if __name__ == "__main__":
    main()

"""Mixed precision and memory layout: step time and agreement with float32, side by side.

For each variant of (search.precision, search.channels_last) -- float32, float32+channels_last,
bf16, bf16+channels_last, and on CUDA fp16 and fp16+channels_last -- a SearchTrainer on the
space of --config (optionally cut to --layers searchable layers, scripts.common.truncated)
with synthetic data, all starting from the same weights:

  search step   one weight step + one θ step (SearchTrainer.weight_step / theta_step, so the
                autocast, loss scaling and layout conversion are the trainer's own), on a fixed
                batch. Each round times every variant once, in forward order on even rounds
                and reverse order on odd ones; reported: median and min-max over rounds, and
                the ratio of medians float32 / variant (> 1: the variant is faster).
  child step    the same for a retrain step (ChildTrainer.train_step) of the network whose
                every layer is the space's largest candidate.
  agreement     from identical weights and the same sampled path: the relative L2 error of the
                logits, the relative error of the FBNet loss, and the cosine similarity of the
                θ gradient, each against float32.

    python -m scripts.speed.precision                       # fbnet_cifar10, 8 layers, CPU
    python -m scripts.speed.precision --layers 0 --device cuda --batch 128
    python -m scripts.speed.precision --repeats 2 --layers 3 --batch 8   # a quick check
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from fbnas.arch import arch_from_indices
from fbnas.retrain import ChildTrainer
from fbnas.training.precision import cpu_has_bf16
from scripts import common


def variants(device: str) -> list[tuple[str, bool]]:
    out = [("float32", False), ("float32", True), ("bf16", False), ("bf16", True)]
    if device == "cuda":
        out += [("fp16", False), ("fp16", True)]
    return out


def label(v: tuple[str, bool]) -> str:
    return v[0] + ("+channels_last" if v[1] else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(common.SPACES["fbnet_cifar10"]))
    ap.add_argument("--layers", type=int, default=8, help="searchable layers (0: all)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    space, how = common.truncated(common.run_config(args.config).space, args.layers)
    vs = variants(args.device)
    with tempfile.TemporaryDirectory(prefix="fbnas-bench-precision-") as tmp, \
            common.closing({}) as trainers:

        def cfg_for(v: tuple[str, bool], name: str):
            sets = [f"data.{k}" for k in ("dataset=synthetic", f"synthetic_size={4 * args.batch}",
                                          f"batch_size={args.batch}", "workers=0",
                                          "val_fraction=0")]
            for sec in ("search", "retrain"):
                sets += [f"{sec}.device={args.device}", f"{sec}.precision={v[0]}",
                         f"{sec}.channels_last={str(v[1]).lower()}", f"{sec}.epochs=2",
                         f"{sec}.warmup_epochs=0"]
            sets += ["latency.cost=flops", "retrain.measure_latency=false",
                     f"run.dir={Path(tmp) / name}", "run.progress=false",
                     "run.tensorboard=false"]
            return common.run_config(args.config, sets, space)

        torch.manual_seed(0)
        search = {v: common.search_trainer(cfg_for(v, f"s-{label(v)}")) for v in vs}
        trainers.update({("s", v): t for v, t in search.items()})
        for tr in search.values():
            tr.model.load_state_dict(search[vs[0]].model.state_dict())
        big = [len(c) - 1 - list(reversed(c)).index(max(
            (o for o in c if o != "skip"), key=lambda o: (int(o.split("_e")[1].split("_")[0]),
                                                          o))) for c in space.layer_candidates()]
        arch = arch_from_indices(space, big, "largest")
        child = {v: ChildTrainer(cfg_for(v, f"c-{label(v)}"), arch, Path(tmp) / f"c-{label(v)}")
                 for v in vs}
        trainers.update({("c", v): t for v, t in child.items()})
        for tr in child.values():
            tr.model.load_state_dict(child[vs[0]].model.state_dict())
        x, y = common.first_batch(search[vs[0]])
        agree = agreement(search, x, y)
        jobs = {}
        for v in vs:
            jobs[("search", v)] = lambda t=search[v]: common.search_step(t, x, y, args.steps)
            jobs[("child", v)] = lambda t=child[v]: [t.train_step(x, y) for _ in range(args.steps)]
        # one warm-up round (kernel selection, caches)
        times = common.interleave(jobs, args.repeats, args.device, warmup=1)
    step = {k: common.Spread.of([t / args.steps for t in ts]) for k, ts in times.items()}
    if args.device == "cpu":
        print(f"CPU: {torch.backends.cpu.get_cpu_capability()}, native bf16: {cpu_has_bf16()}")
    print(f"precision / layout on {space.name} ({space.num_layers} searchable layers"
          f"{'; ' + how if how else ''}), batch {args.batch}, device {args.device}, "
          f"{args.threads} threads, {args.repeats} rounds")
    print(f"{'variant':<22} {'search step ms':>26} {'speed-up':>8} {'child step ms':>26} "
          f"{'speed-up':>8} {'logits err':>10} {'loss err':>9} {'θ-grad cos':>10}")
    l0, t0, g0 = agree[vs[0]]
    for v in vs:
        cells = ""
        for kind in ("search", "child"):
            s, ref = step[(kind, v)], step[(kind, vs[0])].median
            cells += f" {s.median * 1e3:>9.1f} [{s.lo * 1e3:6.1f}-{s.hi * 1e3:6.1f}] "
            cells += f"{ref / s.median:>8.2f}"
        lv, tv, gv = agree[v]
        err = float((lv - l0).norm() / l0.norm())
        cos = float(F.cosine_similarity(gv, g0, dim=0))
        print(f"{label(v):<22}{cells} {err:>10.2e} {abs(tv - t0) / abs(t0):>9.2e} {cos:>10.5f}")


def agreement(search: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Per variant, from identical weights and the same sampled path: the logits, the FBNet
    loss and the θ gradient."""
    agree = {}
    for v, tr in search.items():
        tr.model.train()
        torch.manual_seed(1)
        p = tr.net.sample_path(1.0)
        with tr.prec.autocast():
            logits, cost = tr.model(tr.prec.input(x), m=p.m, cost_m=p.cost_m)
        terms = tr.loss(logits.float(), y, cost.float())
        g = torch.cat(torch.autograd.grad(terms.total, tr.net.arch_parameters()))
        agree[v] = (logits.detach().float(), float(terms.total.detach()), g)
    return agree


if __name__ == "__main__":
    main()

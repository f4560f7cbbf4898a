"""Mixed precision and memory layout: step time and agreement with float32, side by side.

For each variant of (search.precision, search.channels_last) -- float32, float32+channels_last,
bf16, bf16+channels_last, and on CUDA fp16 and fp16+channels_last -- a SearchTrainer on the
space of --config (optionally cut to --layers searchable layers, as scripts/bench_modes.py)
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

    python scripts/bench_precision.py                       # fbnet_cifar10, 8 layers, CPU
    python scripts/bench_precision.py --layers 0 --device cuda --batch 128
    python scripts/bench_precision.py --repeats 2 --layers 3 --batch 8   # a quick check
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_modes import truncated  # noqa: E402

from fbnas.arch import arch_from_indices  # noqa: E402
from fbnas.config import config_from_dict  # noqa: E402
from fbnas.io import load_yaml  # noqa: E402
from fbnas.retrain import ChildTrainer  # noqa: E402
from fbnas.run import close_logger  # noqa: E402
from fbnas.trainer import SearchTrainer  # noqa: E402


def variants(device: str) -> list[tuple[str, bool]]:
    out = [("float32", False), ("float32", True), ("bf16", False), ("bf16", True)]
    if device == "cuda":
        out += [("fp16", False), ("fp16", True)]
    return out


def label(v: tuple[str, bool]) -> str:
    return v[0] + ("+channels_last" if v[1] else "")


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/fbnet_cifar10.yaml"))
    ap.add_argument("--layers", type=int, default=8, help="searchable layers (0: all)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    raw = load_yaml(args.config)
    space, how = truncated(config_from_dict(raw, args.config).space, args.layers)
    tmp = Path(tempfile.mkdtemp(prefix="fbnas-bench-precision-"))
    vs = variants(args.device)

    def cfg_for(v: tuple[str, bool], name: str):
        d = copy.deepcopy(raw)
        d["space"] = space.to_dict()
        d["data"] = {"dataset": "synthetic", "synthetic_size": 4 * args.batch,
                     "batch_size": args.batch, "workers": 0, "val_fraction": 0.0}
        d["latency"] = {"cost": "flops"}
        d["search"] = {**d.get("search", {}), "device": args.device, "precision": v[0],
                       "channels_last": v[1], "epochs": 2, "warmup_epochs": 0}
        d["retrain"] = {**d.get("retrain", {}), "device": args.device, "precision": v[0],
                        "channels_last": v[1], "epochs": 2, "warmup_epochs": 0,
                        "measure_latency": False}
        d["run"] = {"dir": str(tmp / name), "progress": False, "tensorboard": False}
        return config_from_dict(d, f"{args.config} ({label(v)})")

    torch.manual_seed(0)
    search = {v: SearchTrainer(cfg_for(v, f"s-{label(v)}"), tmp / f"s-{label(v)}") for v in vs}
    base = search[vs[0]]
    for tr in search.values():
        tr.model.load_state_dict(base.model.state_dict())
    big = [len(c) - 1 - list(reversed(c)).index(max(
        (o for o in c if o != "skip"), key=lambda o: (int(o.split("_e")[1].split("_")[0]),
                                                      o))) for c in space.layer_candidates()]
    arch = arch_from_indices(space, big, "largest")
    child = {v: ChildTrainer(cfg_for(v, f"c-{label(v)}"), arch, tmp / f"c-{label(v)}")
             for v in vs}
    for tr in child.values():
        tr.model.load_state_dict(child[vs[0]].model.state_dict())
    dev = torch.device(args.device)
    x, y = next(iter(base.data.w_loader))
    x, y = x.to(dev), y.to(dev)

    # ---- agreement with float32 ------------------------------------------------------------
    agree = {}
    for v, tr in search.items():
        tr.model.train()
        torch.manual_seed(1)
        p = tr.model.sample_path(1.0)
        with tr.prec.autocast():
            logits, cost = tr.model(tr.prec.input(x), m=p.m, cost_m=p.cost_m)
        terms = tr.loss(logits.float(), y, cost.float())
        g = torch.cat(torch.autograd.grad(terms.total, tr.model.arch_parameters()))
        agree[v] = (logits.detach().float(), float(terms.total.detach()), g)
    l0, t0, g0 = agree[vs[0]]

    # ---- step times ---------------------------------------------------------------------------
    def search_step(tr):
        for _ in range(args.steps):
            tr.weight_step(x, y)
            tr.theta_step(x, y)

    def child_step(tr):
        for _ in range(args.steps):
            tr.train_step(x, y)

    times: dict[tuple[str, tuple[str, bool]], list[float]] = {}
    for r in range(args.repeats + 1):  # round 0 warms up (kernel selection, caches)
        order = vs if r % 2 == 0 else list(reversed(vs))
        for v in order:
            for kind, tr, fn in (("search", search[v], search_step),
                                 ("child", child[v], child_step)):
                sync(args.device)
                t = time.perf_counter()
                fn(tr)
                sync(args.device)
                if r:
                    times.setdefault((kind, v), []).append(
                        (time.perf_counter() - t) / args.steps)
    for tr in (*search.values(), *child.values()):
        close_logger(tr.log)

    from fbnas.precision import cpu_has_bf16

    if args.device == "cpu":
        print(f"CPU: {torch.backends.cpu.get_cpu_capability()}, native bf16: {cpu_has_bf16()}")
    print(f"precision / layout on {space.name} ({space.num_layers} searchable layers"
          f"{'; ' + how if how else ''}), batch {args.batch}, device {args.device}, "
          f"{args.threads} threads, {args.repeats} rounds")
    print(f"{'variant':<22} {'search step ms':>26} {'speed-up':>8} {'child step ms':>26} "
          f"{'speed-up':>8} {'logits err':>10} {'loss err':>9} {'θ-grad cos':>10}")
    ref_s = statistics.median(times[("search", vs[0])])
    ref_c = statistics.median(times[("child", vs[0])])
    for v in vs:
        s, c = times[("search", v)], times[("child", v)]
        ms, mc = statistics.median(s), statistics.median(c)
        lv, tv, gv = agree[v]
        err = float((lv - l0).norm() / l0.norm())
        cos = float(F.cosine_similarity(gv, g0, dim=0))
        print(f"{label(v):<22} {ms * 1e3:>9.1f} [{min(s) * 1e3:6.1f}-{max(s) * 1e3:6.1f}] "
              f"{ref_s / ms:>8.2f} {mc * 1e3:>9.1f} [{min(c) * 1e3:6.1f}-{max(c) * 1e3:6.1f}] "
              f"{ref_c / mc:>8.2f} {err:>10.2e} {abs(tv - t0) / abs(t0):>9.2e} {cos:>10.5f}")


if __name__ == "__main__":
    main()

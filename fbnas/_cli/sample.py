"""`fbnas sample RUN_DIR [--hard | --soft -n K]`: architectures out of a search run.

`--hard` (the default) is the architecture `fbnas train` returned (the run's arch_hard.yaml:
argmax θ fitted onto the run's target, measured where the run's fit measured); `--refit` fits it
again (`--fit-measure` overriding the run's `search.fit_measure`) and says what changed. For a
device fbnas cannot run on, `--near-target K --bundle DIR` writes the K most probable
architectures predicted near the target as a runtime bundle, and `--pick DIR/results.json`
(after `run_bundle.py` ran on the device) chooses the most probable one measured inside the
band. The work is `fbnas.fit.sample`'s; this module parses and prints.
"""

from __future__ import annotations

from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.settings import FIT_MEASURES


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="write architecture YAML from a search run's θ")
    p.add_argument("run_dir", help="a search run directory")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--hard", action="store_true",
                      help="the run's architecture, as fbnas train returned it (default)")
    mode.add_argument("--soft", action="store_true", help="draw from softmax θ per layer")
    p.add_argument("-n", type=int, default=5, help="draws for --soft (deduplicated by hash)")
    p.add_argument("--seed", type=int, default=0, help="random seed for --soft")
    p.add_argument("--out", help="output folder (default RUN_DIR/samples)")
    p.add_argument("--refit", action="store_true",
                   help="--hard: fit θ's argmax onto the target again (timing it where the "
                        "run's fit measured) and say what changed against the run's")
    p.add_argument("--fit-measure", choices=FIT_MEASURES,
                   help="--refit: time the fitted network here and re-fit (default: the run's "
                        "search.fit_measure)")
    mode.add_argument("--near-target", type=int, metavar="K",
                      help="write the K most probable architectures predicted near the run's "
                           "target as a runtime bundle (--bundle DIR) to time on the device")
    p.add_argument("--near", type=float, default=0.1, metavar="F",
                   help="--near-target: predictions spread over target x (1 ± F) (default 0.1)")
    p.add_argument("--bundle", metavar="DIR", help="--near-target: the bundle folder to write")
    mode.add_argument("--pick", metavar="RESULTS",
                      help="a --near-target bundle's results.json: pick the most probable "
                           "architecture measured within search.fit_tolerance of the target")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.fit.sample import described, hard_arch, near_target_bundle, pick_measured, soft_archs
    from fbnas.fit.search_run import SearchRun

    run_dir = Path(args.run_dir)
    run = SearchRun.open(run_dir)
    cfg, theta, table = run.config, run.theta, run.table
    out = Path(args.out) if args.out else run_dir / "samples"
    other = args.soft or args.near_target is not None or args.pick
    if (args.refit or args.fit_measure) and other:
        raise FbnasError("sample: --refit and --fit-measure go with --hard")
    if args.fit_measure and not args.refit:
        raise FbnasError("sample: --fit-measure goes with --refit (--hard gives the run's "
                         "architecture as it was measured)")
    if args.near_target is not None:
        near_target_bundle(run, args.near_target, args.near, args.bundle)
        print(f"copy {args.bundle} to the device, run `python run_bundle.py` there, copy "
              f"results.json back, then: fbnas sample {run_dir} --pick {args.bundle}/"
              "results.json")
        return 0
    if args.bundle:
        raise FbnasError("sample: --bundle goes with --near-target K")
    if args.pick:
        arch = pick_measured(run, args.pick)
        path = out / "arch_picked.yaml"
        arch.save(path)
        print(f"{path}: {arch.choices_text(cfg.space)}")
        return 0
    if args.soft:
        archs = soft_archs(cfg, theta, args.n, args.seed)
        names = [f"soft_{i + 1}" for i in range(len(archs))]
    else:
        archs = [hard_arch(run, args.refit, args.fit_measure)]
        names = ["hard"]
    for a, name in zip(archs, names, strict=True):
        arch = described(a, name, run)
        path = out / f"arch_{name}.yaml"
        arch.save(path)
        m = arch.meta
        pred = (f"  predicted {m['predicted']:.1f} {table.unit}"
                if table is not None else "")
        print(f"{path}: p={m['probability']:.3g}{pred}  params {m['params'] / 1e6:.3f} M  "
              f"FLOPs {m['flops'] / 1e6:.1f} M  [{arch.short_hash}]")
        print(f"  {a.choices_text(cfg.space)}")
    return 0

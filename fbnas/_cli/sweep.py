"""`fbnas sweep --config CONFIG.yaml --beta 0,2,4,8`: the latency–accuracy front."""

from __future__ import annotations

import sys

from fbnas.errors import FbnasError
from fbnas.sweep import PARAMS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="search at several loss settings, retrain each, plot latency vs accuracy",
        description="For each value of one loss parameter, or each point of a grid of any "
                    "settings (--grid): search (OUT/search-<label>), retrain "
                    "the argmax architecture (OUT/retrain-<label>); also retrain the space's "
                    "reference architectures and a few random ones; time all children together; "
                    "write OUT/sweep.csv, sweep.json and sweep.png. Re-running the same command "
                    "resumes. A cost weight of 0 is the cost-blind search (loss.kind ce). For "
                    "the FBNet loss, sweep --beta: alpha only scales the loss.")
    p.add_argument("--config", required=True, help="search config YAML")
    vals = p.add_mutually_exclusive_group()
    for name in PARAMS:  # --targets: the one spelling of targets in every command
        vals.add_argument(f"--{name}s" if name == "target" else f"--{name}", dest=name,
                          metavar=None if name == "target" else "V1,V2,...",
                          help=f"comma-separated values of loss.{name} (as --grid "
                               f"loss.{name}=V1,V2,...)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="an axis of the sweep's grid: a config key and its values, e.g. "
                        "search.mode=full,reinforce or loss.target=0.5x,0.8x (repeatable; "
                        "every combination is searched; the first axis, or --alpha/--beta/"
                        "--lambda/--targets, is the one the front is drawn along)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field for every run (repeatable)")
    p.add_argument("--out", metavar="DIR", help="sweep directory (default: <run.dir>-sweep)")
    p.add_argument("--retrain-epochs", type=int,
                   help="epochs of each retrain (default: the config's retrain.epochs)")
    p.add_argument("--no-retrain", action="store_true",
                   help="search only: no retrains, reference or random networks, nor timing "
                        "(judge the searches with fbnas bench score OUT --bench FILE)")
    p.add_argument("--random", type=int, default=5, metavar="N",
                   help="random architectures to retrain for contrast (default 5)")
    p.add_argument("--reference", action="append", default=[], metavar="ARCH.yaml",
                   help="another reference architecture to retrain (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed for the random architectures")
    p.add_argument("--seeds", metavar="S1,S2,...",
                   help="search every value once per search seed (search.seed; labels "
                        "<param><value>-seed<S>); default: the config's seed, once")
    p.add_argument("--bench", metavar="FILE",
                   help="a ground-truth benchmark of the space (fbnas bench build): points "
                        "read their accuracy and latency from it instead of retraining")
    p.add_argument("--threads", type=int, metavar="T",
                   help="torch threads of each search and retrain (default: torch's own; "
                        "with --workers: the cores / N). Results are identical between "
                        "serial and Ray sweeps at the same T")
    ray = p.add_argument_group("parallel sweeps on Ray (pip install 'fbnas[ray]')")
    ray.add_argument("--workers", type=int, metavar="N",
                     help="run the searches and retrains as Ray tasks, N at a time, on a local "
                          "Ray started for the sweep (1 or absent: one after another here)")
    ray.add_argument("--ray-address", metavar="ADDR",
                     help="run the tasks on this running Ray cluster (OUT, the data and the "
                          "latency cache on a filesystem every node sees)")
    ray.add_argument("--gpus-per-task", type=float, metavar="G",
                     help="GPUs of each task training on CUDA, e.g. 0.5 for two per GPU "
                          "(default 1 where Ray sees GPUs)")
    ray.add_argument("--retries", type=int, default=1, metavar="R",
                     help="retries of a task whose worker died (each resumes from its "
                          "checkpoint; default 1)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.runs.provenance import import_ray
    from fbnas.sweep.driver import Sweep
    from fbnas.sweep.grid import parse_axis, parse_values
    from fbnas.sweep.ray_tasks import RaySweep
    from fbnas.training.loop import Interrupted

    grid = [parse_axis(g) for g in args.grid]
    param = next((n for n in PARAMS if getattr(args, n) is not None), None)
    if param is not None:
        values = parse_values(getattr(args, param), param)
    elif grid:
        first = grid.pop(0)
        param, values = first.loss_param or first.key, list(first.values)
    else:
        raise FbnasError("sweep: give the values to sweep: --beta/--lambda/--alpha/--targets "
                         "V1,V2,... or --grid KEY=V1,V2,...")
    if args.random < 0:
        raise FbnasError(f"--random: must be >= 0, got {args.random}")
    if args.retrain_epochs is not None and args.retrain_epochs < 1:
        raise FbnasError(f"--retrain-epochs: must be >= 1, got {args.retrain_epochs}")
    if args.workers is not None and args.workers < 1:
        raise FbnasError(f"--workers: must be >= 1, got {args.workers}")
    seeds = None
    if args.seeds is not None:
        try:
            seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
        except ValueError:
            raise FbnasError(f"--seeds: {args.seeds!r} is not a list of integers") from None
    on_ray = args.ray_address is not None or (args.workers or 1) > 1
    if on_ray:  # before the configs are read: a missing extra is said at once
        import_ray(f"fbnas sweep --workers {args.workers}" if args.ray_address is None
                   else f"fbnas sweep --ray-address {args.ray_address}")
    sw = Sweep(args.config, param, values, args.out, args.set, args.reference, args.random,
               args.seed, args.retrain_epochs, seeds=seeds, threads=args.threads,
               bench=args.bench, grid=grid, retrain=not args.no_retrain)
    try:
        if on_ray:
            s = RaySweep(sw, args.workers, args.ray_address, args.gpus_per_task,
                         args.retries).run()
        else:
            s = sw.run()
    except Interrupted:
        print("sweep interrupted after saving; run the same command again to resume",
              file=sys.stderr)
        return 130
    if "failed" in s:
        return 1
    w = max([18, *(len(r["label"]) + 2 for r in s["points"])])
    print(f"\n{'label':<{w}}{'kind':<10}{'predicted us':>14}{'measured us':>13}{'top-1':>8}  arch")
    for r in s["points"]:
        def f(v, fmt):
            return (format(v, fmt) if isinstance(v, (int, float))
                    else "-".rjust(int(fmt.split(".")[0])))
        top1 = "-" if r["top1"] is None else f"{100 * r['top1']:.2f}%"
        print(f"{r['label']:<{w}}{r['kind']:<10}{f(r['predicted_us'], '14.1f')}"
              f"{f(r['measured_us'], '13.1f')}{top1:>8}  "
              f"{r['arch_hash'][:12]}{'  (dominated)' if r['dominated'] is True else ''}")
    if sw.retrain:
        print(f"random architectures dominated by a searched one (within noise: latency "
              f"{100 * s['latency_tolerance']:.0f}%, top-1 {100 * s['accuracy_tolerance']:.1f} "
              f"pt): {s['random_dominated']}/{s['random']}"
              + ("" if "random_dominated_per_seed" not in s else " (per search seed: " +
                 ", ".join(f"{k}: {n}" for k, n in s["random_dominated_per_seed"].items())
                 + ")"))
    else:
        print(f"searches only (--no-retrain): judge them with fbnas bench score {sw.out} "
              "--bench FILE")
    print(f"wall time {s['wall_seconds']:.0f} s; written {sw.out / 'sweep.csv'}, "
          f"{sw.out / 'sweep.json'}" + (f", {s['plot']}" if "plot" in s else ""))
    return 0

"""`fbnas fidelity RUN_DIR [-n 10]`: how well the supernet ranks architectures (Kendall τ)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fidelity", help="rank correlation of supernet accuracy estimates vs stand-alone training",
        description="For N architectures of a search run's space (its arch_hard.yaml and "
                    "random ones), estimate validation accuracy on the supernet weights (BN "
                    "re-estimated, as the search's argmax_path_acc) and by retraining each from "
                    "scratch; print Kendall tau and Spearman between the two and write "
                    "RUN_DIR/fidelity/fidelity.json. Re-running resumes.")
    p.add_argument("run_dir", help="a search run directory")
    p.add_argument("-n", type=int, help="architectures (default 10; with --bench, all)")
    p.add_argument("--seed", type=int, default=0, help="seed for the random architectures")
    p.add_argument("--retrain-epochs", type=int, help="epochs of each retrain")
    p.add_argument("--retrains", type=int, default=1, metavar="K",
                   help="retrain each architecture K times (seeds retrain.seed, +1, ...) and "
                        "average; K >= 2 also reports the noise ceiling (retrain vs retrain)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the run's config (e.g. retrain.lr=0.1)")
    p.add_argument("--out", help="output folder (default RUN_DIR/fidelity)")
    p.add_argument("--bench", metavar="FILE",
                   help="a ground-truth benchmark of the run's space: its records replace "
                        "retraining (and -n defaults to every network)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.bench.fidelity import Fidelity

    n = args.n if args.n is not None or args.bench else 10
    Fidelity(args.run_dir, n=n, seed=args.seed, retrain_epochs=args.retrain_epochs,
             out=args.out, overrides=args.set, retrain_seeds=args.retrains,
             bench=args.bench).run()
    return 0

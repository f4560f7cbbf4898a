"""`fbnas plot RUN_DIR`: PNGs of θ (final heatmap, evolution) and loss/cost curves."""

from __future__ import annotations

from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.io import load_json, load_yaml, show
from fbnas.runs.files import RunFiles

SERIES = ("w_ce", "w_acc", "theta_loss", "theta_cost", "argmax_path_ce", "argmax_path_acc",
          "relaxed_acc", "predicted", "argmax_cost", "tau")


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="write PNG plots of a search run")
    p.add_argument("run_dir", help="a search run directory")
    p.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    p.set_defaults(func=run)


def check_run(run_dir: Path) -> None:
    """Check what the plots read (config.yaml's space, every history.json record) before any
    plot is drawn or folder made, so that a damaged file is one line naming it."""
    from fbnas.search_space import SearchSpace

    files = RunFiles(run_dir)
    cfg_path, hist_path = files.config, files.history
    if not hist_path.exists():
        raise FbnasError(f"{run_dir}: no history.json (has the run finished an epoch?)")
    cfg = load_yaml(cfg_path)
    if "space" not in cfg:
        raise FbnasError(f"{cfg_path}: missing key 'space' (is it a search run directory?)")
    cands = SearchSpace.from_dict(cfg["space"], f"{cfg_path}: space").decision_candidates()
    hist = load_json(hist_path, expect=list)
    if not hist:
        raise FbnasError(f"{hist_path}: no epochs recorded yet")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for i, rec in enumerate(hist):
        where = f"{hist_path}: [{i}]"
        if not isinstance(rec, dict):
            raise FbnasError(f"{where}: expected an epoch record (an object), got {show(rec)}")
        if not number(rec.get("epoch")):
            raise FbnasError(f"{where}.epoch: expected a number, got {show(rec.get('epoch'))}")
        probs = rec.get("probs")
        if (not isinstance(probs, list) or len(probs) != len(cands)
                or not all(isinstance(p, list) and len(p) == len(c) and all(map(number, p))
                           for p, c in zip(probs, cands, strict=True))):
            raise FbnasError(f"{where}.probs: expected one list of probabilities per decision "
                             f"of search space '{cfg['space'].get('name')}' "
                             f"({len(cands)}: its layers' ops, then its searched widths)")
        for key in SERIES:
            if rec.get(key) is not None and not number(rec[key]):
                raise FbnasError(f"{where}.{key}: expected a number, got {show(rec[key])}")


def run(args) -> int:
    from fbnas.plots import plot_run

    check_run(Path(args.run_dir))
    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0

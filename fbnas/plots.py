"""PNG plots of a search run from its history.json (matplotlib, the `plot` extra).

- theta_final.png: heatmap of the final per-layer op probabilities (argmax outlined);
- widths_final.png (a width-searched run): the same for each searched stage's widths;
- theta_evolution.png: per layer, each op's probability over epochs;
- curves.png: losses, accuracies, expected and argmax cost, and τ over epochs.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fbnas.errors import FbnasError
from fbnas.io import atomic_write, ensure_dir, load_json, load_yaml
from fbnas.latency.kinds import COST_KINDS
from fbnas.runs.files import RunFiles
from fbnas.search_space import SearchSpace


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FbnasError("plots need matplotlib: pip install 'fbnas[plot]'") from None
    return plt


@contextmanager
def _figure(plt, *args, **kwargs):
    """`plt.subplots(...)` whose figure is closed whatever happens, while drawing or saving, so
    a failed plot leaks no figure into pyplot's global registry."""
    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
    finally:
        plt.close(fig)


def _save(fig, path: Path, dpi: int) -> Path:
    """Write `fig` as a PNG atomically (a temp file in the same folder, then a rename), so a
    failed or interrupted write leaves the previous plot intact and no partial file. The temp
    file is named `.NAME.*.tmp`, so the format is explicit."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi), mode="wb")
    return path


def _history(run_dir: Path) -> list[dict[str, Any]]:
    p = RunFiles(run_dir).history
    if not p.is_file():
        raise FbnasError(f"{run_dir}: no history.json (has the run finished an epoch?)")
    hist = load_json(p, expect=list)
    if not hist:
        raise FbnasError(f"{p}: no epochs recorded yet")
    return hist


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "plots"
    hist = _history(run_dir)
    cfg = load_yaml(RunFiles(run_dir).config)

    space = SearchSpace.from_dict(cfg["space"], f"{RunFiles(run_dir).config}: space")
    ops = space.layer_candidates()
    cost = (cfg.get("latency") or {}).get("cost", "latency")
    unit = COST_KINDS.get(cost).unit if cost in COST_KINDS else ""
    plt = _plt()
    ensure_dir(out)
    n = len(ops)
    written = [_heatmap(plt, hist[-1]["probs"][:n], ops, out / "theta_final.png"),
               _evolution(plt, hist, ops, out / "theta_evolution.png"),
               _curves(plt, hist, unit, out / "curves.png")]
    if space.searches_widths:  # the stages' width probabilities beside the ops'
        written.append(_heatmap(
            plt, hist[-1]["probs"][n:], [space.width_labels(s) for s in space.width_stages()],
            out / "widths_final.png", [f"stage {s}" for s in space.width_stages()],
            "final width probabilities (red: argmax)"))
    return written


def _heatmap(plt, probs, ops, path: Path, labels: list[str] | None = None,
             title: str = "final op probabilities softmax(θ) (red: argmax)") -> Path:
    all_ops = list(dict.fromkeys(o for row in ops for o in row))

    grid = np.full((len(probs), len(all_ops)), np.nan)
    for li, (row, p) in enumerate(zip(ops, probs, strict=True)):
        for o, v in zip(row, p, strict=True):
            grid[li, all_ops.index(o)] = v
    size = (1.0 + 0.75 * len(all_ops), 1.0 + 0.32 * len(probs))
    with _figure(plt, figsize=size) as (fig, ax):
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        for li, (row, p) in enumerate(zip(ops, probs, strict=True)):
            best = all_ops.index(row[max(range(len(p)), key=p.__getitem__)])
            ax.add_patch(plt.Rectangle((best - 0.5, li - 0.5), 1, 1, fill=False, ec="red",
                                       lw=1.5))
        ax.set_xticks(range(len(all_ops)), all_ops, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(probs)), labels or [f"layer {i}" for i in range(len(probs))],
                      fontsize=8)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.03)
        fig.tight_layout()
        return _save(fig, path, dpi=110)


def _evolution(plt, hist, ops, path: Path) -> Path:
    n = len(ops)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    epochs = [h["epoch"] for h in hist]
    with _figure(plt, rows, cols, figsize=(3.2 * cols, 2.2 * rows), squeeze=False,
                 sharex=True, sharey=True) as (fig, axes):
        for li in range(rows * cols):
            ax = axes[li // cols][li % cols]
            if li >= n:
                ax.axis("off")
                continue
            for oi, op in enumerate(ops[li]):
                ax.plot(epochs, [h["probs"][li][oi] for h in hist], label=op, lw=1.2)
            ax.set_title(f"layer {li}", fontsize=9)
            ax.set_ylim(0, 1)
        axes[0][0].legend(fontsize=6, loc="upper left")
        fig.supxlabel("epoch")
        fig.supylabel("P(op)")
        fig.tight_layout()
        return _save(fig, path, dpi=100)


def _curves(plt, hist, unit, path: Path) -> Path:
    ep = [h["epoch"] for h in hist]

    def series(k, old=None):  # `old`: the key an older history used
        return [h.get(k, h.get(old, float("nan"))) for h in hist]

    with _figure(plt, 1, 4, figsize=(16, 3.4)) as (fig, axes):
        axes[0].plot(ep, series("w_ce"), label="weight-step CE")
        axes[0].plot(ep, series("theta_loss"), label="θ-step loss")
        axes[0].plot(ep, series("argmax_path_ce", "val_ce"), label="val CE (argmax path)")
        axes[0].set_yscale("log")  # the θ loss (CE times a cost factor) dwarfs plain CE
        axes[0].set_title("loss (log scale)")
        axes[1].plot(ep, series("w_acc"), label="train (sampled path)")
        axes[1].plot(ep, series("argmax_path_acc", "val_acc"), label="val (argmax path)")
        axes[1].plot(ep, series("relaxed_acc"), label="val (relaxed supernet)")
        axes[1].set_title("accuracy")
        axes[2].plot(ep, series("theta_cost"), label="E[cost] in θ steps")
        axes[2].plot(ep, series("predicted", "argmax_cost"), label="argmax architecture")
        axes[2].set_title(f"cost ({unit})")
        axes[3].plot(ep, series("tau"))
        axes[3].set_title("temperature τ")
        for ax in axes:
            ax.set_xlabel("epoch")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        fig.tight_layout()
        return _save(fig, path, dpi=100)

"""The search's per-epoch figures: what each name in the log, history.json and TensorBoard
measures, the log line, and the TensorBoard scalars (used by fbnas.trainer)."""

from __future__ import annotations

from typing import Any

from torch.utils.tensorboard import SummaryWriter

from fbnas.io import is_number

# history / TensorBoard name -> what it measures (docs/search.md, "What a run writes")
FIGURES = {
    "w_ce": "weight steps' cross-entropy on the paths they trained (weight split)",
    "w_acc": "weight steps' training accuracy on the paths they trained (weight split)",
    "theta_loss": "θ steps' loss (CE combined with the cost term; θ split)",
    "theta_cost": "θ steps' expected cost E[cost] under the sampled / softmax(θ) weights",
    "relaxed_acc": "the relaxed supernet at softmax(θ), no noise, BN re-estimated (validation "
                   "split; modes that compute every candidate)",
    "argmax_path_acc": "the argmax architecture as a single path on the supernet's weights, "
                       "BN re-estimated (validation split)",
    "predicted": "the argmax architecture's predicted cost under the table",
}


def epoch_line(rec: dict[str, Any], epochs: int, unit: str) -> str:
    """One epoch of a search in the plain log."""
    msg = (f"epoch {rec['epoch']}/{epochs} tau {rec['tau']:.3f} "
           f"w_ce {rec.get('w_ce', float('nan')):.3f} w_acc {rec.get('w_acc', 0):.3f}")
    if "theta_loss" in rec:
        msg += f" theta_loss {rec['theta_loss']:.3f} E[cost] {rec['theta_cost']:.1f}{unit}"
    for k in ("relaxed_acc", "argmax_path_acc"):
        if k in rec:
            msg += f" {k} {rec[k]:.3f}"
    return msg + f" predicted {rec['predicted']:.1f}{unit} ({rec['seconds']:.1f}s)"


def tb_scalars(w: SummaryWriter, rec: dict[str, Any], ops: list[list[str]]) -> None:
    """An epoch's numbers, grouped (loss / acc / cost / sched), and θ's softmax per layer."""
    e = rec["epoch"]
    for k, v in rec.items():
        if is_number(v) and k != "epoch":
            group = ("loss" if k.endswith(("ce", "loss", "cost_term")) else
                     "acc" if k.endswith("acc") else "cost" if "cost" in k else "sched")
            w.add_scalar(f"{group}/{k}", v, e)
    for li, (probs, ent) in enumerate(zip(rec["probs"], rec["entropy"], strict=True)):
        w.add_scalars(f"theta/layer{li:02d}", dict(zip(ops[li], probs, strict=True)), e)
        w.add_scalar(f"entropy/layer{li:02d}", ent, e)
    w.add_scalar("entropy/mean", sum(rec["entropy"]) / len(rec["entropy"]), e)

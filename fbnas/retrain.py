"""Training a child network from scratch (the step after a search).

`train_child` is the plain recipe: SGD + momentum, cosine schedule with linear warm-up, label
smoothing, the data layer's augmentation; it selects nothing on the test split (the returned
test accuracy is of the last epoch's weights).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fbnas.arch import Architecture, build_child
from fbnas.checkpoint import seed_everything


@dataclass(frozen=True)
class ChildRecipe:
    epochs: int = 30
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 4e-5
    warmup_epochs: int = 1
    label_smoothing: float = 0.1
    seed: int = 0


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device) -> dict[str, float]:
    """Top-1 / top-5 accuracy and mean cross-entropy over `loader`."""
    model.eval()
    n = top1 = top5 = 0
    ce = 0.0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        ce += float(F.cross_entropy(logits, y, reduction="sum"))
        k = min(5, logits.shape[1])
        pred = logits.topk(k, 1).indices
        top1 += int((pred[:, 0] == y).sum())
        top5 += int((pred == y[:, None]).any(1).sum())
        n += len(y)
    return {"top1": top1 / max(n, 1), "top5": top5 / max(n, 1), "ce": ce / max(n, 1)}


def train_child(arch: Architecture, data_cfg: Any, recipe: ChildRecipe = ChildRecipe(),
                device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train `arch` from scratch on the search's w ∪ θ split; evaluate on val and test."""
    from fbnas.data import build_train_data

    device = torch.device(device)
    seed_everything(recipe.seed)
    data = build_train_data(data_cfg, arch.macro.input_size, arch.macro.in_channels,
                            arch.macro.num_classes, recipe.seed)
    model = build_child(arch).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                          weight_decay=recipe.weight_decay, nesterov=True)
    steps_per_epoch = len(data.train_loader)
    total = recipe.epochs * steps_per_epoch
    warm = recipe.warmup_epochs * steps_per_epoch

    def lr_at(step: int) -> float:
        if step < warm:
            return recipe.lr * (step + 1) / warm
        return 0.5 * recipe.lr * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    step = 0
    t0 = time.perf_counter()
    images = 0
    for epoch in range(recipe.epochs):
        data.set_epoch(epoch)
        model.train()
        for x, y in data.train_loader:
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y, label_smoothing=recipe.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            images += len(y)
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"train_seconds": seconds, "images_per_s": images / max(seconds, 1e-9)}
    if data.val_loader is not None:
        out["val"] = evaluate(model, data.val_loader, device)
    out["test"] = evaluate(model, data.test_loader, device)
    out["model"] = model
    return out

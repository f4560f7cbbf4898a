"""Accuracy on a split: a trained child's (`evaluate`, used by `fbnas eval` and retrain), and one
path of a supernet's (`path_sums`, `validate_weights`: the search's validation and `fbnas
fidelity`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fbnas.data.loaders import take_images
from fbnas.training._step import host_values, metric
from fbnas.training.distributed import sync_bn_stats


# ---- evaluation ------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device | str = "cpu"
             ) -> dict[str, float]:
    """Top-1 / top-5 accuracy and mean cross-entropy over `loader` (model in eval mode, so
    BatchNorm uses the child's own running statistics)."""
    device = torch.device(device)
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
    return {"top1": top1 / max(n, 1), "top5": top5 / max(n, 1), "ce": ce / max(n, 1), "n": n}


@torch.no_grad()
def path_sums(net: torch.nn.Module, loader, device: torch.device, m, active
              ) -> dict[str, float]:
    """{"correct", "ce" (summed), "n"} of the supernet path `m` / `active` over `loader`, in
    eval mode (BatchNorm as re-estimated for that path, if it was); summed on the device and
    read once."""
    net.eval()
    n = 0
    sums: dict[str, Any] = {"correct": 0.0, "ce": 0.0}
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits, _ = net(x, m=m, active=active)
        sums["ce"] = sums["ce"] + metric(F.cross_entropy(logits, y, reduction="sum"))
        sums["correct"] = sums["correct"] + metric((logits.argmax(1) == y).sum())
        n += len(y)
    return {**host_values(sums), "n": n}


@torch.no_grad()
def validate_weights(net: torch.nn.Module, data: Any, device: torch.device, m, active,
                     calib_samples: int, dist: Any) -> dict[str, float]:
    """{"acc", "ce"} of the supernet with mixing weights `m` over candidates `active` (a
    single path, or the relaxation with active None) on the validation split, after
    re-estimating its BatchNorm statistics on `calib_samples` un-augmented weight-split
    images; under torchrun each rank takes its shard of both and the figures are combined."""
    if calib_samples and data.calib_loader is not None:
        limit = calib_samples
        if dist.distributed:  # each rank calibrates on its shard; the same total
            limit = -(-limit // dist.world_size)
        used = net.recalibrate_bn(take_images(data.calib_loader, limit, device), m, active)
        if dist.distributed:  # the ranks' estimates, weighted by their samples
            sync_bn_stats(dist, net, weight=used)
    s = path_sums(net, data.val_loader, device, m, active)
    correct, n, ce_sum = int(s["correct"]), s["n"], s["ce"]
    if dist.distributed:  # each rank evaluated its shard of the validation split
        correct, n, ce_sum = dist.sum_floats([correct, n, ce_sum])
    return {"acc": correct / max(n, 1), "ce": ce_sum / max(n, 1)}

"""Architectures as data: a macro-architecture plus one op per searchable layer.

An Architecture is saved and loaded as YAML a person can read and edit, identified by a
content hash (as NAS-Bench-101 hashes a ModelSpec), and built into a standalone network by
`build_child` — no MixedOp, no search state.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from fbnas.blocks import build_block, canonical_op, init_weights
from fbnas.errors import FbnasError
from fbnas.io import VALUE_KINDS, load_yaml, show, write_yaml_atomic
from fbnas.macro import MacroSpec, parse_macro
from fbnas.search_space import SearchSpace
from fbnas.settings import Fields

ARCH_SCHEMA = 1

# The keys fbnas writes in an architecture file's `meta`, declared once: kind and meaning.
# Costs are in `cost_unit`, the table's unit (us for latency). fbnas's writers go through
# `checked_meta`, which refuses a key not declared here; a file's declared keys are checked
# when it is read (a person's own keys are kept as they are).
META_FIELDS: dict[str, tuple[str, str]] = {
    "run": ("str", "the search run directory the architecture came from"),
    "epoch": ("int", "the search epoch θ was read at"),
    "selection": ("str", "how it was taken out: hard, soft, picked, ..."),
    "probability": ("num", "its probability under θ"),
    "log_probability": ("num", "the log of that"),
    "layer_probabilities": ("list", "each layer's probability of its op under θ"),
    "params": ("num", "parameter count"),
    "flops": ("num", "FLOPs (a multiply-add counts 2)"),
    "cost_unit": ("str", "the unit of target, predicted and measured"),
    "target": ("num", "the cost the search was asked for (loss.target resolved)"),
    "predicted": ("num", "the table's cost of the network"),
    "measured": ("num", "the network timed end to end, once more after it was chosen"),
    "measured_rel_iqr": ("num", "that timing's interquartile range over its median"),
    "measured_inside": ("bool", "whether that timing is within search.fit_tolerance"),
    "measured_on": ("any", "the device a bundle's figures came from, as its results say"),
    "bundle": ("str", "the bundle whose timings picked it"),
    "selection_measured": ("num", "the timing that chose it"),
    "selection_rel_iqr": ("num", "that timing's interquartile range over its median"),
    "selection_inside": ("bool", "whether that timing was within the tolerance"),
    "fitted_layers": ("int", "layers the fit onto the target changed from θ's argmax"),
    "fit_seconds": ("num", "seconds the measured fit took"),
    "fit_rounds": ("list", "every network the measured fit timed"),
    "final_pick": ("map", "the paths the final pick scored, ranked and trained"),
    "search_cost": ("map", "what the search spent: seconds per stage, and R"),
    "edited": ("bool", "the file's ops or macro no longer match its recorded hash"),
}


def check_meta_values(meta: dict[str, Any], where: str) -> None:
    """Raise a one-line FbnasError naming `where`.meta.KEY where a declared key holds a value
    of another kind (null is allowed)."""
    for key, v in meta.items():
        if key in META_FIELDS and v is not None:
            ok, what = VALUE_KINDS[META_FIELDS[key][0]]
            if not ok(v):
                raise FbnasError(f"{where}: meta.{key}: expected {what}, got {show(v)}")


def checked_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` as fbnas writes it: every key declared in META_FIELDS (else a programming error,
    ValueError) and of its kind."""
    unknown = sorted(set(meta) - set(META_FIELDS))
    if unknown:
        raise ValueError(f"architecture meta: undeclared keys {unknown} (declare them in "
                         "fbnas.arch.META_FIELDS)")
    check_meta_values(meta, "architecture")
    return dict(meta)


@dataclass(frozen=True)
class Architecture:
    macro: MacroSpec
    ops: tuple[str, ...]  # canonical op name per searchable layer
    name: str = "arch"
    space: str | None = None  # name of the search space it came from (informational)
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        n = self.macro.num_layers
        if len(self.ops) != n:
            raise FbnasError(f"architecture '{self.name}': {len(self.ops)} ops for {n} layers")

    # ---- identity -----------------------------------------------------------------------
    def hash(self) -> str:
        """sha256 over the canonical JSON of (macro, ops); the name and meta do not count."""
        blob = json.dumps({"macro": self.macro.to_dict(), "ops": list(self.ops)},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def short_hash(self) -> str:
        return self.hash()[:12]

    # ---- relation to a space ------------------------------------------------------------
    def check_fits(self, space: SearchSpace, where: str = "architecture") -> None:
        """Raise unless this architecture is a member of `space` (its ops, and its stage
        widths among the space's width choices)."""
        space.width_indices(self.macro, where)
        for i, (op, cands) in enumerate(zip(self.ops, space.layer_candidates(), strict=True)):
            if op not in cands:
                raise FbnasError(f"{where}: layer {i} op '{op}' is not a candidate of search "
                                 f"space '{space.name}' ({', '.join(cands)})")

    def choices_text(self, space: SearchSpace | None = None) -> str:
        """Its ops, and where `space` searches widths, those stages' channels: one line."""
        text = " ".join(self.ops)
        if space is not None and space.searches_widths:
            text += "  widths " + " ".join(f"c{self.macro.stages[s].channels}"
                                           for s in space.width_stages())
        return text

    def stage_ops(self) -> list[list[str]]:
        out, i = [], 0
        for st in self.macro.stages:
            out.append(list(self.ops[i:i + st.repeats]))
            i += st.repeats
        return out

    # ---- (de)serialisation --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"fbnas_arch": ARCH_SCHEMA, "name": self.name}
        if self.space:
            d["space"] = self.space
        d["hash"] = self.hash()
        d["macro"] = self.macro.to_dict()
        d["ops"] = self.stage_ops()
        if self.meta:
            d["meta"] = self.meta
        return d

    @classmethod
    def from_dict(cls, data: Any, where: str = "architecture") -> Architecture:
        f = Fields(data, where)
        f.schema("fbnas_arch", ARCH_SCHEMA, "upgrade fbnas to read it",
                 "re-export it with this fbnas, e.g. fbnas sample RUN_DIR")
        name = f.str("name", "arch")
        space = f.str("space", None)
        stored_hash = f.str("hash", None)
        mf = f.sub("macro", required=True)
        macro, _, _ = parse_macro(mf, with_candidates=False)
        mf.done()
        macro.layers(f"{where}: macro")
        raw_ops = f.list("ops", required=True, nonempty=True)
        meta = f.raw("meta", {}) or {}
        if not isinstance(meta, dict):
            raise FbnasError(f"{f.at('meta')}: expected a mapping, got {show(meta)}")
        try:  # meta is written back with the architecture: it must be plain YAML data
            yaml.safe_dump(meta)
        except (yaml.YAMLError, ValueError, RecursionError) as e:
            raise FbnasError(f"{f.at('meta')}: not plain YAML data "
                             f"({type(e).__name__})") from None
        check_meta_values(meta, where)
        f.done()
        if len(raw_ops) != len(macro.stages):
            raise FbnasError(f"{f.at('ops')}: {len(raw_ops)} stage lists for "
                             f"{len(macro.stages)} stages")
        ops: list[str] = []
        for si, (stage_ops, st) in enumerate(zip(raw_ops, macro.stages, strict=True)):
            key = f"{f.at('ops')}[{si}]"
            if not isinstance(stage_ops, list) or len(stage_ops) != st.repeats:
                raise FbnasError(f"{key}: expected a list of {st.repeats} ops "
                                 f"(stage repeats), got {show(stage_ops)}")
            for j, op in enumerate(stage_ops):
                try:
                    ops.append(canonical_op(op))
                except FbnasError as e:
                    raise FbnasError(f"{key}[{j}] (layer {len(ops)}): {e}") from None
        arch = cls(macro, tuple(ops), name, space, meta)
        if stored_hash is not None and stored_hash != arch.hash():
            # The file was edited: the ops or macro changed, so the recorded hash is stale.
            arch.meta["edited"] = True
        return arch

    def save(self, path: str | Path) -> None:
        check_meta_values(self.meta, str(path))
        write_yaml_atomic(path, self.to_dict())

    def with_meta(self, **fields: Any) -> Architecture:
        """This architecture with `fields` added to its meta (declared keys only)."""
        return Architecture(self.macro, self.ops, self.name, self.space,
                            {**self.meta, **checked_meta(fields)})

    @classmethod
    def load(cls, path: str | Path) -> Architecture:
        return cls.from_dict(load_yaml(path), str(path))


# ---- sampling from θ ------------------------------------------------------------------------
def arch_from_indices(space: SearchSpace, indices: Sequence[int], name: str = "arch",
                      **meta) -> Architecture:
    """The architecture taking choice `indices[d]` in each decision of `space`
    (`decision_candidates`: the layers' ops, then the searched stages' widths)."""
    cands = space.layer_candidates()
    n = len(space.decision_candidates())
    if len(indices) != n:
        raise FbnasError(f"space '{space.name}': {len(indices)} choices for {n} decisions")
    ops = tuple(c[i] for c, i in zip(cands, indices[:len(cands)], strict=True))
    return Architecture(space.arch_macro(indices[len(cands):]), ops, name, space.name,
                        checked_meta(meta))


def sample_hard(space: SearchSpace, theta: Sequence[torch.Tensor], name: str = "arch"):
    """argmax θ per decision (each layer's op, each searched stage's width)."""
    return arch_from_indices(space, [int(t.detach().argmax()) for t in theta], name)


def sample_soft(space: SearchSpace, theta: Sequence[torch.Tensor], generator=None,
                name: str = "arch") -> Architecture:
    """One draw from softmax θ per decision."""
    idx = [int(torch.multinomial(torch.softmax(t.detach().float().cpu(), -1), 1,
                                 generator=generator)) for t in theta]
    return arch_from_indices(space, idx, name)


def random_archs(space: SearchSpace, n: int, seed: int, exclude: set[str] = frozenset()
                 ) -> list[Architecture]:
    """`n` distinct uniformly random architectures of the space (hashes not in `exclude`)."""
    g = torch.Generator().manual_seed(seed)
    cands = space.decision_candidates()
    out: dict[str, Architecture] = {}
    tries = 0
    total = math.prod(len(c) for c in cands)
    while len(out) < min(n, total - len(exclude)) and tries < 100 * max(n, 1):
        idx = [int(torch.randint(len(c), (1,), generator=g)) for c in cands]
        a = arch_from_indices(space, idx, f"random{len(out) + 1}")
        tries += 1
        if a.hash() not in exclude:
            out.setdefault(a.hash(), a)
    return list(out.values())


def arch_indices(space: SearchSpace, arch: Architecture) -> list[int]:
    """The choice of each decision: each searchable layer's op index, then each searched
    stage's width index."""
    return [*(c.index(op) for c, op in zip(space.layer_candidates(), arch.ops, strict=True)),
            *space.width_indices(arch.macro, arch.name)]


def log_prob(theta: Sequence[torch.Tensor], indices: Sequence[int]) -> float:
    """log P_θ(a) = Σ_l log softmax(θ_l)[a_l], in double precision, for the architecture with
    candidate `indices` (the one place it is computed; `search.modes.path_log_prob` is its
    differentiable twin for the score-function θ step)."""
    return float(sum(torch.log_softmax(t.detach().double().cpu(), -1)[i]
                     for t, i in zip(theta, indices, strict=True)))


def arch_log_prob(space: SearchSpace, theta: Sequence[torch.Tensor], arch: Architecture) -> float:
    """log P_θ(arch): `log_prob` of its indices in `space`."""
    return log_prob(theta, arch_indices(space, arch))


# ---- the standalone child network -----------------------------------------------------------
class ChildNet(nn.Module):
    """stem -> one chosen block per searchable layer -> head."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.arch = arch
        self.stem = arch.macro.build_stem()
        self.blocks = nn.Sequential(*[
            _build_layer(op, la.c_in, la.c_out, la.stride, la.index)
            for op, la in zip(arch.ops, arch.macro.layers(arch.name), strict=True)])
        self.head = arch.macro.build_head()
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _build_layer(op: str, c_in: int, c_out: int, stride: int, index: int) -> nn.Module:
    try:
        return build_block(op, c_in, c_out, stride)
    except FbnasError as e:
        raise FbnasError(f"layer {index}: {e}") from None


def build_child(arch: Architecture) -> ChildNet:
    return ChildNet(arch)


def module_flops(module: nn.Module, input_chw: Sequence[int], device: str | torch.device = "cpu"
                 ) -> int:
    """FLOPs of one forward of `module` (as it is: put it in eval mode first) on a zero input
    of batch 1, counted by torch's FlopCounterMode: 2 per multiply-add of the convolutions and
    matrix products, as is usual for FLOP counts; the one way fbnas counts FLOPs (a table's
    `flops` kind, `child_stats`, the fake timer). On the meta device nothing is computed."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, *input_chw, device=device)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        module(x)
    return int(counter.get_total_flops())


def count_params(module: nn.Module, input_chw: Sequence[int] | None = None) -> int:
    """The parameters of `module` (`input_chw`, which they do not depend on, is taken so that
    it counts as `module_flops` does: a cost kind's counter)."""
    return sum(p.numel() for p in module.parameters())


@torch.no_grad()
def count_flops(model: nn.Module, input_size: tuple[int, int], in_channels: int = 3) -> int:
    """FLOPs of one forward at batch 1 in eval mode (`module_flops`: torch's
    FlopCounterMode, 2 FLOPs per multiply-add of the convolutions and linear layers)."""

    was_training = model.training
    model.eval()
    flops = module_flops(model, (in_channels, *input_size))
    model.train(was_training)
    return flops


def child_stats(arch: Architecture) -> dict[str, Any]:
    """Parameters, FLOPs and multiply-adds of the child network of `arch`."""
    net = build_child(arch)
    flops = count_flops(net, arch.macro.input_size, arch.macro.in_channels)
    return {"params": count_params(net), "flops": flops, "macs": flops // 2, "hash": arch.hash()}

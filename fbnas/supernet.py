"""MixedOp and the Gumbel-softmax Supernet.

MixedOp holds one layer's candidate blocks and nothing else. The Supernet owns θ (one logit
vector per searchable layer), samples m = GumbelSoftmax(θ, τ) per forward, and returns the
logits together with the expected cost Σ_l Σ_i m_li · cost(b_li) computed from the same m.
Costs are plain buffers (latency in µs, FLOPs, params — whatever table was given); nothing is
threaded through forward and nothing calls `.cuda()`, so the module moves with `.to(device)`
and works unchanged under DistributedDataParallel.

A search mode (`search.mode`, `search.weight_sampling`; the registry `MODES` of
fbnas.search.modes, each class's docstring states its sampling; docs/search_modes.md) decides
how a forward samples paths: which candidates are computed and with what weights m.

`checkpoint_activations` recomputes each MixedOp's activations in backward instead of storing
them (BatchNorm running statistics are updated once per forward, as without it); `cheap` keeps
the convolutions' outputs and recomputes only what is cheap from them (BatchNorm, ReLU, the
mixing), so a layer keeps its input and its convolutions' outputs, not the normalised and
activated tensors too (selective activation checkpointing, torch >= 2.4).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import checkpoint

try:  # selective activation checkpointing (torch >= 2.4)
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
except ImportError:  # pragma: no cover - older torch: `cheap` is refused (CHECKPOINT_VALUES)
    CheckpointPolicy = create_selective_checkpoint_contexts = None

from fbnas.arch import Architecture, build_child
from fbnas.blocks import build_block, init_weights
from fbnas.blocks.batched import LayerBatches
from fbnas.blocks.masked import choice_masks, expansion, masked_branch, mix
from fbnas.blocks.shared import (
    WEIGHT_SHARING,
    SharedIRFWeights,
    build_shared,
    child_state,
    own_weight_keys,
    sharable,
)
from fbnas.errors import FbnasError
from fbnas.latency.cost_model import OpCosts
from fbnas.latency.width_costs import WidthCosts
from fbnas.search.modes import PathSample, SearchMode, get_mode, gumbel_weights
from fbnas.search_space import SearchSpace

CostRows = Sequence[Mapping[str, float]] | Sequence[Sequence[float]]


@contextmanager
def _bn_stats_frozen(module: nn.Module) -> Iterator[None]:
    """Run BatchNorm layers in `module` without changing their running statistics.

    Used while a checkpointed block is recomputed in backward: its forward already updated
    the statistics once. Momentum 0 leaves running_mean/var bit-for-bit unchanged
    (r·1 + batch·0) while the op saves exactly the tensors it saved the first time (which
    activation checkpointing checks); num_batches_tracked is put back afterwards.
    """
    bns = [b for b in module.modules()
           if isinstance(b, nn.modules.batchnorm._BatchNorm) and b.track_running_stats
           and b.running_mean is not None]
    with _disable_current_modes():  # bookkeeping, not the recompute (`cheap`'s dispatch mode
        saved = [(b.momentum, None if b.num_batches_tracked is None  # checks its ops)
                  else b.num_batches_tracked.clone()) for b in bns]
    for b in bns:
        b.momentum = 0.0
    try:
        yield
    finally:
        with _disable_current_modes():
            for b, (mo, n) in zip(bns, saved, strict=True):
                b.momentum = mo
                if n is not None:
                    b.num_batches_tracked.copy_(n)


# search.checkpoint_activations: nothing recomputed, every activation of a layer, or only what
# is cheap to recompute from its convolutions' outputs (kept)
CHECKPOINT_VALUES = (False, True, "cheap")
_KEPT_IN_CHEAP = (torch.ops.aten.convolution.default,)


def check_checkpoint_setting(value: object, where: str) -> bool | str:
    """A `checkpoint_activations` setting read: true, false or cheap (one line otherwise, and
    where this torch has no selective checkpointing)."""
    if value not in CHECKPOINT_VALUES or (value in (0, 1) and not isinstance(value, bool)):
        raise FbnasError(f"{where}: expected true, false or cheap, got {value!r}")
    if value == "cheap" and create_selective_checkpoint_contexts is None:
        raise FbnasError(f"{where}: cheap needs selective activation checkpointing (torch >= "
                         f"2.4; this is {torch.__version__})")
    return value


def _cheap_policy(ctx, op, *args, **kwargs):
    """Keep the convolutions' outputs over activation maps; recompute the rest (BatchNorm,
    ReLU, mixing) from them. A convolution over a 1x1 map (squeeze-and-excitation's, whose
    output an in-place ReLU then changes, which a kept tensor must not be) is recomputed:
    it is tiny."""
    keep = op in _KEPT_IN_CHEAP and args[0].shape[-2:].numel() > 1
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def _cheap_contexts():
    return create_selective_checkpoint_contexts(_cheap_policy)


def _gives_branch(block: nn.Module) -> bool:
    """Whether `block` is residual and its forward takes `shortcut` (False: the branch alone)."""
    if not getattr(block, "has_skip", False):
        return False
    try:
        return "shortcut" in inspect.signature(block.forward).parameters
    except (TypeError, ValueError):
        return False


class MixedOp(nn.Module):
    """The candidate blocks of one searchable layer: forward(x, m) = Σ_i m_i · b_i(x).

    When the layer keeps its shape (stride 1, c_in == c_out) and every candidate is residual —
    `has_skip` true and a `forward(x, shortcut=False)` that returns f_i, where b_i(x) =
    x + f_i(x), or None for the identity (`skip`) — the shared shortcut is factored out:
    forward(x, m) = x + Σ_i m_i f_i(x).
    That is the same value whenever Σ_i m_i = 1 (every search mode's weights, soft or one-hot),
    and the same θ gradient in `full` and `two_path` (the x term's gradient Σ_i ∂m_i/∂θ is 0).
    In `single_path`, which computes one candidate, it matters: m_i · b_i(x) only rescales the
    layer's whole output, which the next conv + BatchNorm undoes, so the straight-through CE
    gradient to θ was ~0 there; m_i · f_i(x) changes the output's direction, so θ learns
    whether the sampled branch helps (docs/search_modes.md).
    """

    def __init__(self, ops: Sequence[str], c_in: int, c_out: int, stride: int,
                 weights: str = "separate", widths: tuple | None = None):
        super().__init__()
        self.op_names = tuple(ops)
        if weights not in WEIGHT_SHARING:
            raise FbnasError(f"search.weights: {weights!r} is not one of {WEIGHT_SHARING}")
        # `shared`: the plain IRF candidates are views of one superkernel (fbnas.blocks.shared)
        self.shared, sliced = (build_shared(ops, c_in, c_out, stride) if weights == "shared"
                               else (None, {}))
        self.candidates = nn.ModuleList(sliced[i] if i in sliced
                                        else build_block(o, c_in, c_out, stride)
                                        for i, o in enumerate(ops))
        # x + Σ m_i f_i(x) (see above) when the layer keeps its shape and every candidate
        # can give its residual branch; a custom block that cannot keeps Σ m_i b_i(x)
        self.shortcut = (c_in == c_out and stride == 1
                         and all(_gives_branch(b) for b in self.candidates))
        # m_i · output folded into the candidate's last BatchNorm (no multiply over the
        # activation, nothing extra saved for backward) where the candidate can (its class's
        # `folds_scale`: forward's `scale` multiplies its residual branch) and what is mixed is
        # that branch (`_folded`: under the shared shortcut, or a block without a skip)
        self.folds = [bool(getattr(b, "folds_scale", False)) for b in self.candidates]
        # which candidates are computed together where all are (None: none can be)
        self.batches = LayerBatches.plan(self.candidates, [self._folded(i) for i in range(
            len(self.candidates))])
        # recompute this layer's activations in backward (training with grad only): False,
        # True (all of them) or "cheap" (all but the convolutions' outputs)
        self.checkpoint_activations: bool | str = False
        # width search (fbnas.blocks.masked): 0/1 rows per width choice of the input (each
        # candidate's expanded channels) and of the output; None where the width is fixed
        din, cin, dout, cout = widths or (None, (c_in,), None, (c_out,))
        self.masked = din is not None or dout is not None
        self.hidden = ([choice_masks([c * expansion(o) for c in cin], c_in * expansion(o))
                        if din is not None and expansion(o) else None for o in ops]
                       if self.masked else [])
        for i, h in enumerate(self.hidden):
            if h is not None:
                self.register_buffer(f"hidden_{i}", h, persistent=False)
        if dout is not None:
            self.register_buffer("out_masks", choice_masks(cout, c_out), persistent=False)

    def forward(self, x: torch.Tensor, m: torch.Tensor,
                active: Sequence[int] | None = None, w_in: torch.Tensor | None = None,
                w_out: torch.Tensor | None = None) -> torch.Tensor:
        """Σ_i m_i · b_i(x) over all candidates, or only over `active` ones (the others are
        taken to have m_i = 0 and are not computed); in a width-searched layer with the
        input's and output's width weights `w_in`, `w_out` (fbnas.blocks.masked)."""
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            first = [True]

            def run(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
                if first[0]:  # the real forward
                    first[0] = False
                    return self._mix(x, m, active, w_in, w_out)
                with _bn_stats_frozen(self):  # the recompute in backward
                    return self._mix(x, m, active, w_in, w_out)

            kw = {"context_fn": _cheap_contexts} if self.checkpoint_activations == "cheap" else {}
            return checkpoint(run, x, m, use_reentrant=False, **kw)
        return self._mix(x, m, active, w_in, w_out)

    def _mix(self, x: torch.Tensor, m: torch.Tensor, active: Sequence[int] | None,
             w_in: torch.Tensor | None = None, w_out: torch.Tensor | None = None
             ) -> torch.Tensor:
        if self.masked:
            return self._masked_mix(x, m, active, w_in, w_out)
        if active is None and self.batches is not None:
            return self._mix_together(x, m)
        out = x if self.shortcut else None
        kw = {"shortcut": False} if self.shortcut else {}
        for i in range(len(self.candidates)) if active is None else active:
            out = self._add(out, self._branch(i, functools.partial(self.candidates[i], x), m,
                                              kw))
        return out

    def _folded(self, i: int) -> bool:
        """Whether m_i is folded into candidate i's last BatchNorm: the candidate can (its
        class's `folds_scale`) and what is mixed is its branch (under the shared shortcut, or
        a block without a skip)."""
        b = self.candidates[i]
        return self.folds[i] and (self.shortcut or not getattr(b, "has_skip", False))

    def _branch(self, i: int, call, m: torch.Tensor, kw: dict) -> torch.Tensor | None:
        """m_i · candidate i's output (`call`: its forward from x, or from a stage computed
        together), None for the identity's branch under the shared shortcut."""
        if self._folded(i):  # m_i folded into the candidate's last BatchNorm
            return call(scale=m[i], **kw)
        y = call(**kw)
        return None if y is None else m[i] * y

    @staticmethod
    def _add(out: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
        return out if y is None else y if out is None else out + y

    def _mix_together(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Every candidate: those that read x alike computed together up to their first
        depthwise stage, the folded projections normalised together and summed at once
        (fbnas.blocks.batched); the rest one by one."""
        bt = self.batches
        first = bt.first_stages(self.candidates, x)
        out = x if self.shortcut else None
        together = (bt.projections(self.candidates, x, first, m)
                    if bt.project and all(self._folded(i) for i in bt.project) else None)
        done = set(bt.project) if together is not None else set()
        out = self._add(out, together)
        kw = {"shortcut": False} if self.shortcut else {}
        for i, b in enumerate(self.candidates):
            if i not in done:
                call = functools.partial(b.finish, x, first[i]) if i in first else \
                    functools.partial(b, x)
                out = self._add(out, self._branch(i, call, m, kw))
        return out

    def _masked_mix(self, x: torch.Tensor, m: torch.Tensor, active: Sequence[int] | None,
                    w_in: torch.Tensor | None, w_out: torch.Tensor | None) -> torch.Tensor:
        """A width-searched layer (fbnas.blocks.masked): Σ_i m_i f_i(x) with each candidate's
        expanded channels masked by the input's width and its output by the output's (folded,
        with m_i, into each candidate's last BatchNorm); under the shared shortcut x is added
        unmasked (the same decision masked it already)."""
        mask = None if w_out is None else mix(w_out, self.out_masks)
        out = None
        for i in range(len(self.candidates)) if active is None else active:
            h = getattr(self, f"hidden_{i}", None)
            y = masked_branch(self.candidates[i], x,
                              None if h is None or w_in is None else mix(w_in, h), mask, m[i])
            if y is None:  # the identity's branch under the shared shortcut: 0
                continue
            out = y if out is None else out + y
        if not self.shortcut:
            return out
        return x if out is None else x + out


class Supernet(nn.Module):
    """stem -> MixedOp x L -> head, with θ and a per-(layer, op) cost table."""

    def __init__(self, space: SearchSpace, costs: CostRows | None = None,
                 fixed_cost: float = 0.0, mode: str = "full",
                 checkpoint_activations: bool | str = False, weights: str = "separate",
                 width_costs: WidthCosts | None = None):
        super().__init__()
        self.space = space
        self.stem = space.macro.build_stem()
        layers = space.layers()
        cands = space.layer_candidates()
        self.weights = weights
        # width search: per layer, the decisions its input and output widths come from
        self.wiring = ([(din, dout) for din, _, dout, _ in space.layer_widths()]
                       if space.searches_widths else None)
        self.mixed = nn.ModuleList(
            MixedOp(c, la.c_in, la.c_out, la.stride, weights,
                    space.layer_widths()[la.index] if self.wiring else None)
            for c, la in zip(cands, layers, strict=True))
        self.head = space.macro.build_head()
        init_weights(self)
        # θ starts uniform: every candidate equally likely. One logit vector per decision:
        # each layer's op, then each searched stage's width (SearchSpace.decision_candidates)
        self.theta = nn.ParameterList(nn.Parameter(torch.zeros(len(c)))
                                      for c in space.decision_candidates())
        self.set_costs(costs, fixed_cost)
        self.width_costs = width_costs
        self.mode = mode
        self.checkpoint_activations = checkpoint_activations

    # ---- how paths are sampled and stored ----------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode.name

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = get_mode(mode)

    @property
    def search_mode(self) -> SearchMode:
        """The registered mode object (fbnas.search.modes): how a step samples paths."""
        return self._mode

    @property
    def checkpoint_activations(self) -> bool | str:
        """False, True or "cheap" (every MixedOp's; False where they differ)."""
        got = {op.checkpoint_activations for op in self.mixed}
        return got.pop() if len(got) == 1 else False

    @checkpoint_activations.setter
    def checkpoint_activations(self, on: bool | str) -> None:
        value = check_checkpoint_setting(on, "checkpoint_activations")
        for op in self.mixed:
            op.checkpoint_activations = value

    # ---- compilation --------------------------------------------------------------------------
    def compile_blocks(self, backend: str = "inductor") -> int:
        """`torch.compile` the stem, every candidate block and the head, each in place
        (`nn.Module.compile`: parameter names and checkpoints unchanged). The mixing of paths
        stays in Python, so a step of any search mode runs compiled blocks whatever it samples:
        a block compiles once per input shape and train/eval state (its recompilation limit is
        raised to fit), never once per sampled path. A block whose compilation fails runs
        eagerly (dynamo's suppress_errors). Candidates are then computed one by one (each
        through its compiled forward), not together (fbnas.blocks.batched). Returns the
        number of blocks compiled."""
        import torch._dynamo as dynamo

        if not hasattr(nn.Module, "compile"):
            raise FbnasError("search.compile: needs torch >= 2.2 (nn.Module.compile); "
                             f"this is torch {torch.__version__}")
        known = dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise FbnasError(f"search.compile_backend: {backend!r} is not a torch.compile "
                             f"backend (known: {', '.join(sorted(known))})")
        mods = [self.stem, self.head, *(b for op in self.mixed for b in op.candidates)]
        need = 4 * len(mods) + 8
        for name, n in (("cache_size_limit", need), ("recompile_limit", need),
                        ("accumulated_cache_size_limit", 2 * need),
                        ("accumulated_recompile_limit", 2 * need)):
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, max(getattr(dynamo.config, name), n))
        dynamo.config.suppress_errors = True
        for m in mods:
            m.compile(backend=backend)
        for op in self.mixed:  # each candidate through its compiled forward, not together
            op.batches = None
        return len(mods)

    # ---- parameters, told apart by identity -----------------------------------------------
    def load_search_state(self, state: dict[str, torch.Tensor], where: str) -> None:
        """Load a search checkpoint's `model` state; one that does not fit is a one-line error
        naming `where`: a shared-weight run written before grouped candidates shared their
        layer's superkernel (2026-11-26) holds their own convolutions, which this supernet
        has no place for (dropping them would change what those paths compute mid-run)."""
        mine = self.state_dict()
        extra = [k for k in state if k not in mine]
        missing = [k for k in mine if k not in state]
        if self.weights == "shared" and extra and set(extra) <= own_weight_keys(self):
            raise FbnasError(f"{where}: written before grouped candidates shared their layer's "
                             f"superkernel: it holds their own convolutions ({extra[0]}, "
                             f"{len(extra)} in all), which a shared-weight supernet no longer "
                             "has; search again (its children still retrain and load)")
        if extra or missing:
            raise FbnasError(f"{where}: its weights do not fit this supernet ({len(extra)} "
                             f"unexpected, e.g. {extra[:1]}; {len(missing)} missing, e.g. "
                             f"{missing[:1]})")
        shape = next((k for k, v in state.items() if tuple(v.shape) != tuple(mine[k].shape)),
                     None)
        if shape is not None:
            raise FbnasError(f"{where}: its weights do not fit this supernet ({shape}: "
                             f"{tuple(state[shape].shape)} saved, {tuple(mine[shape].shape)} "
                             "here)")
        self.load_state_dict(state)

    def arch_parameters(self) -> list[nn.Parameter]:
        return list(self.theta)

    def weight_parameters(self) -> list[nn.Parameter]:
        arch = {id(p) for p in self.theta}
        return [p for p in self.parameters() if id(p) not in arch]

    def superkernels(self) -> list[SharedIRFWeights]:
        """The layers' shared superkernels (`weights: shared`; none with separate weights)."""
        return [op.shared for op in self.mixed if op.shared is not None]

    # ---- costs ------------------------------------------------------------------------------
    def set_costs(self, costs: CostRows | None, fixed_cost: float = 0.0) -> None:
        """Install a cost table: one row per layer, a mapping op -> cost or a list in op order.

        `fixed_cost` (stem + head) is added to every expected cost. Without a table every
        candidate costs 0.
        """
        cands = self.space.layer_candidates()
        if costs is not None and len(costs) != len(cands):
            raise FbnasError(f"cost table has {len(costs)} rows for {len(cands)} layers")
        for li, ops in enumerate(cands):
            row = costs[li] if costs is not None else [0.0] * len(ops)
            if isinstance(row, Mapping):
                missing = [o for o in ops if o not in row]
                if missing:
                    raise FbnasError(f"cost table: layer {li} has no cost for op '{missing[0]}'")
                row = [row[o] for o in ops]
            if len(row) != len(ops):
                raise FbnasError(f"cost table: layer {li} has {len(row)} costs for "
                                 f"{len(ops)} candidates")
            t = torch.tensor([float(v) for v in row], dtype=torch.float32)
            if not torch.isfinite(t).all() or (t < 0).any():
                raise FbnasError(f"cost table: layer {li} has a negative or non-finite cost")
            name = f"cost_{li}"
            if hasattr(self, name):
                getattr(self, name).copy_(t)
            else:
                self.register_buffer(name, t, persistent=False)
        self.fixed_cost = float(fixed_cost)

    def cost_rows(self) -> list[torch.Tensor]:
        return [getattr(self, f"cost_{li}") for li in range(len(self.mixed))]

    def dearest_path(self) -> list[int]:
        """Each decision's choice in the most costly architecture (each layer's most costly
        candidate, the first of equals; with searched widths, the dearest under
        `width_costs`, else the widest): the sandwich rule's largest network."""
        if self.width_costs is not None:
            return self.width_costs.dearest()
        widest = [len(t) - 1 for t in self.theta[len(self.mixed):]]
        return [*(int(torch.argmax(c)) for c in self.cost_rows()), *widest]

    def expected_cost(self, m: Sequence[torch.Tensor]) -> torch.Tensor:
        """Σ_l Σ_i m_li · cost_li + fixed cost (with searched widths and their costs, the
        exact expectation over the ops' and widths' weights: WidthCosts.expected)."""
        n = len(self.mixed)
        if self.width_costs is not None:
            return self.width_costs.expected(m[:n], m[n:])
        total = sum((mi * ci).sum() for mi, ci in zip(m[:n], self.cost_rows(), strict=True))
        return total + self.fixed_cost

    def cost_bounds(self) -> tuple[float, float]:
        """The cheapest and dearest architecture's cost under the installed table."""
        if self.width_costs is not None:
            return self.width_costs.bounds()
        return OpCosts([r.tolist() for r in self.cost_rows()], self.fixed_cost).bounds()

    # ---- sampling -------------------------------------------------------------------------------
    def sample_weights(self, tau: float, hard: bool = False) -> list[torch.Tensor]:
        """m_l = GumbelSoftmax(θ_l, τ); `hard` gives one-hot samples with straight-through grads.
        All layers in one batched op (no host synchronisation)."""
        return gumbel_weights(self.theta, tau, hard)

    def sample_path(self, tau: float, hard: bool = False, mode: str | None = None) -> PathSample:
        """Sample the weights (and the candidates to compute) for one forward in `mode`
        (default: this supernet's mode; the modes of fbnas.search.modes say how). Gradients reach θ
        unless called under no_grad."""
        m = self._mode if mode is None else get_mode(mode)
        return m.sample(self.theta, tau, hard)

    def path(self, indices: Sequence[int]) -> tuple[list[torch.Tensor], list[list[int]]]:
        """(m, active) of the single path choosing candidate `indices[l]` in layer l: one-hot
        weights on θ's device and dtype, and that candidate alone computed."""
        m = [F.one_hot(torch.tensor(int(i)), len(t)).to(t.dtype).to(t.device)
             for i, t in zip(indices, self.theta, strict=True)]
        return m, [[int(i)] for i in indices]

    def probabilities(self) -> list[torch.Tensor]:
        return [torch.softmax(t.detach(), -1) for t in self.theta]

    def entropy(self) -> torch.Tensor:
        """Entropy (nats) of softmax(θ_l) per layer."""
        return torch.stack([-(p * torch.log(p.clamp_min(1e-30))).sum()
                            for p in self.probabilities()])

    # ---- forward --------------------------------------------------------------------------------
    def argmax_indices(self) -> list[int]:
        return [int(t.detach().argmax()) for t in self.theta]

    def shared_stem(self, x: torch.Tensor, times: int) -> torch.Tensor:
        """The stem's output on `x` for `times` forwards of the same batch (`forward`'s
        `stem`), computed once; in training its BatchNorm's running statistics are updated
        `times` times all the same, by the same op on the same input (bit for bit what
        `times` forwards leave). The stem is a ConvBN (`MacroSpec.build_stem`)."""
        conv, bn, *rest = self.stem
        z = conv(x)
        y = bn(z)
        if bn.training:
            with torch.no_grad():
                for _ in range(times - 1):
                    bn(z)
        for mod in rest:
            y = mod(y)
        return y

    def forward(self, x: torch.Tensor, tau: float = 1.0, hard: bool = False,
                m: Sequence[torch.Tensor] | None = None,
                active: Sequence[Sequence[int]] | None = None,
                cost_m: Sequence[torch.Tensor] | None = None,
                stem: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (logits, expected cost). Without `m`, weights are sampled in this supernet's
        mode (`sample_path`); pass `m` to use given weights, `active` (candidate indices per
        layer) to compute only those paths, and `cost_m` to weight the cost otherwise than
        by `m` (a PathSample gives all three). `stem`: the stem's output on `x`, computed
        once for several forwards of one batch (`shared_stem`)."""
        if m is None:
            sample = self.sample_path(tau, hard)
            m, active, cost_m = sample.m, sample.active, sample.cost_m
        y = self.stem(x) if stem is None else stem
        n = len(self.mixed)
        if len(m) != len(self.theta):
            raise FbnasError(f"supernet: {len(m)} weight vectors for {len(self.theta)} decisions")
        for li, (op, mi) in enumerate(zip(self.mixed, m[:n], strict=True)):
            if self.wiring is None:
                y = op(y, mi, None if active is None else active[li])
                continue
            din, dout = self.wiring[li]
            y = op(y, mi, None if active is None else active[li],
                   None if din is None else m[n + din], None if dout is None else m[n + dout])
        return self.head(y), self.expected_cost(m if cost_m is None else cost_m)

    @torch.no_grad()
    def recalibrate_bn(self, batches, m: Sequence[torch.Tensor],
                       active: Sequence[Sequence[int]] | None = None) -> int:
        """Re-estimate BatchNorm running statistics for the path(s) given by `m`/`active`.

        In a supernet, a layer's BN statistics are gathered on the mixture of its input paths;
        a single architecture sees other activations, so its eval-mode accuracy is garbage
        until its statistics are re-estimated. `batches` yields image tensors (no labels) on the
        right device (`fbnas.data.loaders.take_images`).
        Returns the number of samples used.
        """
        bns = [b for b in self.modules() if isinstance(b, nn.modules.batchnorm._BatchNorm)]
        momenta = [b.momentum for b in bns]
        was_training = self.training
        for b in bns:
            b.reset_running_stats()
            b.momentum = None  # cumulative average over the calibration batches
        self.train()
        n = 0
        try:
            for x in batches:
                self(x, m=m, active=active)
                n += len(x)
        finally:
            for b, mo in zip(bns, momenta, strict=True):
                b.momentum = mo
            self.train(was_training)
        return n


# ---- a supernet's weights as a child's ---------------------------------------------------------
def supernet_child_state(search_state: dict[str, Any], arch: Architecture,
                         where: str = "supernet") -> dict[str, torch.Tensor]:
    """The child's state dict taken from a supernet's: stem and head as they are, and for each
    layer the weights of the candidate `arch` chose (`mixed.{i}.candidates.{j}.*` ->
    `blocks.{i}.*`). The architecture must be a member of the search run's space."""
    space = SearchSpace.from_dict(search_state["config"]["space"], f"{where}: config: space")
    arch.check_fits(space, f"{where}: architecture {arch.name}")
    src = search_state["model"]
    out: dict[str, torch.Tensor] = {}
    for k, v in src.items():
        if k.startswith(("stem.", "head.")):
            out[k] = v
    layers = space.layers()
    for i, (op, cands) in enumerate(zip(arch.ops, space.layer_candidates(), strict=True)):
        prefix = f"mixed.{i}.candidates.{cands.index(op)}."
        for k, v in src.items():
            if k.startswith(prefix):
                out[f"blocks.{i}.{k[len(prefix):]}"] = v
        shared = {k: src.get(f"mixed.{i}.shared.{k}") for k in ("pw", "dw", "pwl")}
        if (all(v is not None for v in shared.values()) and sharable(op) is not None
                and f"{prefix}pw.0.weight" not in src):
            # search.weights: shared: this candidate's convs are slices of the superkernel
            # (a grouped candidate of a run before grouped ones shared has its own)
            for k, v in child_state(shared, op, layers[i].c_in).items():
                out[f"blocks.{i}.{k}"] = v
    if arch.macro != space.macro:  # searched widths: each tensor's leading channels
        shapes = {k: v.shape for k, v in build_child(arch).state_dict().items()}
        out = {k: v[tuple(slice(0, n) for n in shapes[k])] if k in shapes else v
               for k, v in out.items()}
    return out

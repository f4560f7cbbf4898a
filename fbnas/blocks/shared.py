"""Weight-sharing candidates (`search.weights: shared`): one superkernel per searchable layer.

FBNet gives every candidate of a layer its own weights, so a single path of the supernet is
only trained when it is sampled: with K candidates a path trains about K times slower than a
child network. With shared weights (Single-Path NAS, Stamoulis et al. 2019; once-for-all;
FBNetV2's channel masks) the plain inverted-residual candidates of a layer — `ir_k{K}_e{E}`,
one group or several, no SE, no cascade — are views of one superkernel of the largest kernel and
expansion:

    expand   1x1 conv  W_pw  [c_in·E_max, c_in]        candidate e: the first c_in·e rows
    depthwise KxK conv W_dw  [c_in·E_max, K_max²]      candidate (k, e): the first c_in·e
                                                       channels, the centred k×k window
    project  1x1 conv  W_pwl [c_out, c_in·E_max]       candidate e: the first c_in·e columns

Each candidate keeps its own BatchNorm layers (its statistics and affine parameters: the
paths see different activations), named as in `IRFBlock`, so that the child network built
from one candidate (`child_state`) loads the sliced convolutions and that candidate's
BatchNorms into the same parameter names as a freshly built block. Training any path trains
the layer's convolutions, which is why single paths train at a child's pace here. Candidates
of other shapes (SE, cascaded, `skip`, custom blocks) keep their own weights. A grouped
candidate (`ir_k3_e1_g2`) shares too: its grouped 1x1 convs are the diagonal blocks of the
dense ones (`_regions`), so it trains with, and trains, the rest of the layer.

An optimizer step acts on a whole parameter: SGD's weight decay and momentum would move the
superkernel entries that no path of the step read (the channels only `e6` uses, the k5 ring)
on every step, though they train only when their candidate is drawn, so large candidates
would drift toward small ones. `search.shared_update: used` (the default) keeps those entries
as they were — value and momentum — around each weight step (`UsedSlices`): the lazy update
that sparse optimizers make, the same step a candidate with its own weights gets when it is
not drawn (its gradient is None, so SGD skips it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.blocks.common import ChannelShuffle
from fbnas.blocks.irf import IRFForward, IRFSpec
from fbnas.blocks.registry import op_spec
from fbnas.errors import FbnasError

# search.weights: FBNet's separate weights per candidate, or one superkernel per layer
WEIGHT_SHARING = ("separate", "shared")
# search.shared_update: what a weight step moves of a superkernel (see the module docstring)
SHARED_UPDATES = ("used", "all")


def sharable(op: str) -> IRFSpec | None:
    """The IRF spec of `op` when it can be a view of the layer's superkernel, else None:
    plain and grouped IRF blocks (a grouped 1x1 conv is a block-diagonal slice of the dense
    one), not SE or cascaded ones."""
    try:
        spec = op_spec(op)
    except FbnasError:
        return None
    if not isinstance(spec, IRFSpec) or spec.se or spec.cascade:
        return None
    return spec


Region = tuple[slice, ...]


def _regions(spec: IRFSpec, c_in: int, c_out: int, kmax: int) -> dict[str, list[Region]]:
    """Where candidate `spec`'s three conv weights lie in the superkernel, named as
    IRFBlock's parameters: the first c_in·e expanded channels, the centred k×k depthwise
    window; a grouped 1x1 conv is the g diagonal blocks of the dense one, stacked along the
    output channels (group j: its outputs' rows, its inputs' columns)."""
    mid, g = c_in * spec.expansion, spec.groups
    off = (kmax - spec.kernel) // 2
    win = slice(off, off + spec.kernel)

    def diagonal(rows: int, cols: int) -> list[Region]:
        r, c = rows // g, cols // g
        return [(slice(j * r, (j + 1) * r), slice(j * c, (j + 1) * c)) for j in range(g)]

    return {"pw.0.weight": diagonal(mid, c_in),
            "dw.0.0.weight": [(slice(0, mid), slice(None), win, win)],
            "pwl.0.weight": diagonal(c_out, mid)}


def _slices(pw: torch.Tensor, dw: torch.Tensor, pwl: torch.Tensor, spec: IRFSpec, c_in: int
            ) -> dict[str, torch.Tensor]:
    """Candidate `spec`'s three conv weights cut from a superkernel (`_regions`): views for a
    dense candidate, the diagonal blocks concatenated for a grouped one."""
    out = {}
    for (key, regions), w in zip(_regions(spec, c_in, pwl.shape[0], dw.shape[-1]).items(),
                                 (pw, dw, pwl), strict=True):
        parts = [w[r] for r in regions]
        out[key] = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out


class SharedIRFWeights(nn.Module):
    """The superkernel of one layer: the largest expansion and kernel among its candidates."""

    def __init__(self, c_in: int, c_out: int, specs: Sequence[IRFSpec]):
        super().__init__()
        self.kmax = max(s.kernel for s in specs)
        mid = c_in * max(s.expansion for s in specs)
        self.pw = nn.Parameter(torch.empty(mid, c_in, 1, 1))
        self.dw = nn.Parameter(torch.empty(mid, 1, self.kmax, self.kmax))
        self.pwl = nn.Parameter(torch.empty(c_out, mid, 1, 1))
        for w in (self.pw, self.dw, self.pwl):  # as init_weights does for a conv
            nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
        self.c_in = c_in
        self.used: set[IRFSpec] = set()  # candidates read with grad on since `used.clear()`
        self._masks: dict[frozenset[IRFSpec], list[torch.Tensor]] = {}

    def slices(self, spec: IRFSpec, c_in: int) -> dict[str, torch.Tensor]:
        """The candidate's three conv weights, named as IRFBlock's parameters."""
        if torch.is_grad_enabled():
            self.used.add(spec)
        return _slices(self.pw, self.dw, self.pwl, spec, c_in)

    def used_masks(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """(parameter, boolean mask of the entries the candidates in `used` read), cached per
        set of candidates (built on the host's knowledge alone: no device sync)."""
        key = frozenset(self.used)
        if key not in self._masks:
            params = (self.pw, self.dw, self.pwl)
            masks = [torch.zeros_like(w, dtype=torch.bool) for w in params]
            for spec in key:
                regions = _regions(spec, self.c_in, self.pwl.shape[0], self.kmax).values()
                for mask, rs in zip(masks, regions, strict=True):
                    for r in rs:
                        mask[r] = True
            self._masks[key] = masks
        return list(zip((self.pw, self.dw, self.pwl), self._masks[key], strict=True))

    def _apply(self, fn, *a, **kw):  # .to(device) and friends: the cached masks are rebuilt
        self._masks = {}
        return super()._apply(fn, *a, **kw)


class UsedSlices:
    """`search.shared_update: used`: an optimizer step leaves the superkernel entries that no
    candidate of the step read as they were, value and optimizer state (momentum)."""

    def __init__(self, stores: Iterable[SharedIRFWeights]):
        self.stores = list(stores)

    def begin(self) -> None:
        """A weight step starts: forget what earlier forwards (θ steps, evaluation) read."""
        for st in self.stores:
            st.used.clear()

    @contextlib.contextmanager
    def step(self, opt: torch.optim.Optimizer) -> Iterator[None]:
        """Around `opt.step()`: put back the unread entries and their optimizer state
        (`torch.where`: no device sync; a superkernel is small)."""
        kept = []
        for st in self.stores:
            for p, read in st.used_masks():
                state = opt.state.get(p, {})
                bufs = {k: v.clone() for k, v in state.items()
                        if isinstance(v, torch.Tensor) and v.shape == p.shape}
                kept.append((p, read, p.detach().clone(), bufs))
        yield
        with torch.no_grad():
            for p, read, value, bufs in kept:
                p.copy_(torch.where(read, p, value))
                for k, v in opt.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor) and v.shape == p.shape:
                        old = bufs.get(k)  # a buffer the step created: zero where unread
                        v.copy_(torch.where(read, v, 0.0 if old is None else old))


class _SlicedConv(nn.Module):
    """A conv whose weight is a slice of the layer's superkernel (it owns no parameters)."""

    def __init__(self, store: SharedIRFWeights, key: str, spec: IRFSpec, c_in: int,
                 stride: int = 1, depthwise: bool = False):
        super().__init__()
        # not registered as a submodule: the MixedOp owns the store, once
        object.__setattr__(self, "store", store)
        self.key, self.spec, self.c_in = key, spec, c_in
        self.stride, self.padding = stride, spec.kernel // 2 if depthwise else 0
        self.kernel_size = (spec.kernel,) * 2 if depthwise else (1, 1)
        self.groups = c_in * spec.expansion if depthwise else spec.groups

    def conv_weight(self) -> torch.Tensor:
        return self.store.slices(self.spec, self.c_in)[self.key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.conv_weight(), None, self.stride, self.padding, 1, self.groups)


class SlicedIRF(IRFForward):
    """An `ir_k{K}_e{E}[_g{G}]` candidate computed on slices of the layer's superkernel, with
    its own BatchNorms; the same function as an IRFBlock holding those weights."""

    def __init__(self, store: SharedIRFWeights, c_in: int, c_out: int, stride: int,
                 spec: IRFSpec):
        super().__init__()
        mid = c_in * spec.expansion
        self.spec = spec
        self.has_skip = c_in == c_out and stride == 1
        self.pw = nn.Sequential(_SlicedConv(store, "pw.0.weight", spec, c_in),
                                nn.BatchNorm2d(mid), nn.ReLU(inplace=True))
        self.shuffle = ChannelShuffle(spec.groups) if spec.groups > 1 else nn.Identity()
        self.dw = nn.Sequential(nn.Sequential(
            _SlicedConv(store, "dw.0.0.weight", spec, c_in, stride, depthwise=True),
            nn.BatchNorm2d(mid), nn.ReLU(inplace=True)))
        self.se = nn.Identity()  # a shared candidate has no squeeze-excite
        self.pwl = nn.Sequential(_SlicedConv(store, "pwl.0.weight", spec, c_in),
                                 nn.BatchNorm2d(c_out))


def own_weight_keys(module: nn.Module) -> set[str]:
    """The state-dict keys the sliced convs under `module` would hold as weights of their own
    (a separate-weight candidate's conv weights: `...candidates.2.pw.0.weight`)."""
    return {f"{name}.weight" for name, m in module.named_modules() if isinstance(m, _SlicedConv)}


def build_shared(ops: Sequence[str], c_in: int, c_out: int, stride: int
                 ) -> tuple[SharedIRFWeights | None, dict[int, SlicedIRF]]:
    """The superkernel of a layer and its sliced candidates by index (the other candidates
    are built as usual); (None, {}) when fewer than two candidates can share."""
    specs = {i: s for i, op in enumerate(ops) if (s := sharable(op)) is not None
             and c_in % s.groups == 0 and c_out % s.groups == 0}
    if len(specs) < 2:
        return None, {}
    store = SharedIRFWeights(c_in, c_out, list(specs.values()))
    return store, {i: SlicedIRF(store, c_in, c_out, stride, s) for i, s in specs.items()}


def child_state(shared: dict[str, torch.Tensor], op: str, c_in: int) -> dict[str, torch.Tensor]:
    """The sliced conv weights of candidate `op`, named as its IRFBlock's parameters, from a
    layer's superkernel state (`pw`, `dw`, `pwl` tensors)."""
    spec = sharable(op)
    if spec is None:
        raise FbnasError(f"op '{op}' is not a view of a shared superkernel")
    cut = _slices(shared["pw"], shared["dw"], shared["pwl"], spec, c_in)
    return {k: v.clone() for k, v in cut.items()}

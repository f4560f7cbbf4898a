"""Search modes: how one training step samples the architecture weights, and which candidate
blocks it computes (`search.mode`, docs/search_modes.md).

A mode is an object registered in MODES. `sample(theta, tau, hard)` turns the per-layer logits
θ into a `PathSample` (the mixing weights m, the candidates computed, the cost weights);
`all_paths` says whether every candidate runs in every step (so every weight gets a gradient,
which DistributedDataParallel needs to know). Every layer is sampled in one batched op over
θ stacked into one [L, K_max] tensor; the sampled modes read their chosen indices back to the
host once per step (they decide which blocks run), `full` not at all.

To add a mode: a `SearchMode` subclass with `sample`, registered with `@MODES.register(name)`;
`ignores` names the `search:` settings it never reads (a run that sets one says so); `refused`
says why it may draw the weight steps' paths but not be the θ mode.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from fbnas.errors import FbnasError
from fbnas.registry import Registry


@dataclass
class PathSample:
    """One draw of the architecture weights for a forward.

    m:      per-layer mixing weights of the candidates' outputs.
    active: per layer, the candidate indices actually computed (None: all of them); the
            others have m_i = 0 in value.
    cost_m: per-layer weights of the expected cost Σ_i cost_m_i · cost_i (often `m` itself).
    """

    m: list[torch.Tensor]
    active: list[list[int]] | None
    cost_m: list[torch.Tensor]


# ---- one batched op over every layer ------------------------------------------------------------
def stacked(theta: Sequence[torch.Tensor]) -> torch.Tensor:
    """θ of every layer as one [L, K_max] tensor, -inf past a layer's candidates (their
    probability is 0 under any softmax), so that sampling is one op for all layers."""
    return pad_sequence(list(theta), batch_first=True, padding_value=float("-inf"))


def unstack(t: torch.Tensor, theta: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Rows of a stacked tensor cut back to each layer's candidate count."""
    return [t[i, :len(th)] for i, th in enumerate(theta)]


def gumbel_like(t: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise shaped like `t` (drawn as F.gumbel_softmax draws it)."""
    return -torch.empty_like(t, memory_format=torch.legacy_contiguous_format).exponential_().log()


def perturbed(logits: torch.Tensor) -> torch.Tensor:
    """logits + Gumbel noise, the padding kept at -inf (noise of +inf on a pad, from an
    exponential draw of 0, would otherwise make it NaN)."""
    return (logits + gumbel_like(logits)).masked_fill(torch.isneginf(logits), float("-inf"))


def gumbel_soft(logits: torch.Tensor, tau: float) -> torch.Tensor:
    """softmax((θ + Gumbel noise) / τ) of every row of the stacked θ."""
    if not tau > 0:
        raise FbnasError(f"temperature must be > 0, got {tau}")
    return torch.softmax(perturbed(logits) / tau, -1)


def argmax_one_hot(soft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(one-hot of each row's argmax, the argmax indices as an [L, 1] tensor)."""
    idx = soft.detach().argmax(-1, keepdim=True)
    return torch.zeros_like(soft).scatter_(-1, idx, 1.0), idx


def gumbel_weights(theta: Sequence[torch.Tensor], tau: float, hard: bool = False
                   ) -> list[torch.Tensor]:
    """m_l = GumbelSoftmax(θ_l, τ); `hard` gives one-hot samples with straight-through grads.
    All layers in one batched op (no host synchronisation)."""
    soft = gumbel_soft(stacked(theta), tau)
    if not hard:
        return unstack(soft, theta)
    one, _ = argmax_one_hot(soft)
    return unstack(one - soft.detach() + soft, theta)


# ---- the modes -----------------------------------------------------------------------------------
TAU = ("tau0", "tau_schedule", "tau_decay", "tau_min")  # the temperature schedule's settings


class SearchMode:
    """How a step samples paths (see the module docstring)."""

    name = ""
    all_paths = False  # every candidate computed (and given a gradient) in every step
    single = False  # one candidate per layer, weight 1 in value: a single path per step
    # 0: θ's CE gradient flows through the relaxation (m); k > 0: a θ step draws k single
    # paths and estimates the CE gradient by the score function (no backward through the net)
    score_paths = 0
    # `search:` settings it never reads, and why (a clause after its name); `weight_ignores`:
    # those it never reads as the weight steps' sampler (search.weight_sampling, or its own
    # weight steps), where only the values of m count: a superset of `ignores`
    ignores: tuple[str, ...] = ()
    weight_ignores: tuple[str, ...] = ()
    why = weight_why = ""
    # why it cannot be the θ mode (`search.mode`), where the ground-truth benchmark showed it
    # cannot compete (one line; empty: it can); it may still draw the weight steps' paths
    # (`search.weight_sampling`)
    refused = ""

    def sample(self, theta: Sequence[torch.Tensor], tau: float, hard: bool) -> PathSample:
        raise NotImplementedError


MODES: Registry[type[SearchMode]] = Registry("search mode", "search.mode")


def get_mode(name: str) -> SearchMode:
    """The registered mode `name`; an unknown one is a one-line error naming search.mode."""
    return MODES.get(name)()


def theta_modes() -> list[str]:
    """The registered modes search.mode accepts (not `refused` as the θ mode)."""
    return [m for m in MODES.choices() if not get_mode(m).refused]


def refuse_as_theta_mode(mode: str, resuming: bool = False) -> None:
    """A one-line error where a search would start (or resume) with `mode` as its θ mode and
    the mode is `refused` as one; a finished run of it is not refused (it is only read)."""
    if why := get_mode(mode).refused:
        how = (" (a run searched with it cannot be resumed: start a new one)" if resuming
               else "")
        raise FbnasError(f"search.mode: {mode} is not a θ mode{how}: {why}")


@MODES.register("full")
class Full(SearchMode):
    """FBNet: m = GumbelSoftmax(θ, τ) (one-hot straight-through if `hard`); all candidates
    computed; cost weights = m."""

    name, all_paths = "full", True  # reads τ and `hard` in every role

    def sample(self, theta, tau, hard):
        m = gumbel_weights(theta, tau, hard)
        return PathSample(m, None, m)


@MODES.register("single_path")
class SinglePath(SearchMode):
    """GDAS: s = GumbelSoftmax(θ, τ) soft, i = argmax s, m = onehot(i) + s − sg(s) (value
    exactly one-hot, gradient of s: straight-through); only candidate i computed; cost weights
    = m, so the cost's gradient reaches every θ_l. `hard` is implied."""

    name, single = "single_path", True
    ignores, weight_ignores = ("hard",), (*TAU, "hard")
    why = "samples one-hot paths already"
    weight_why = "weight steps train only the argmax path, the same at every τ"
    refused = ("its θ hears the cost but no CE in an FBNet chain (the next BatchNorm "
               "cancels its straight-through gate; docs/bench.md measures it); set "
               "search.mode to reinforce (or a relaxation) and search.weight_sampling to "
               "single_path")

    def sample(self, theta, tau, hard):
        soft = gumbel_soft(stacked(theta), tau)
        one, idx = argmax_one_hot(soft)
        m = unstack(one + (soft - soft.detach()), theta)
        return PathSample(m, [[i] for i in idx.squeeze(-1).tolist()], m)


@MODES.register("two_path")
class TwoPath(SearchMode):
    """ProxylessNAS: {i, j} drawn from softmax(θ) without replacement (Gumbel-top-2),
    m_i, m_j = softmax(θ_i, θ_j), 0 elsewhere; only i, j computed; cost weights = softmax(θ)
    (the expected cost over all candidates), so the cost's gradient reaches every θ_l. `tau`
    and `hard` are not used."""

    name = "two_path"
    ignores = weight_ignores = (*TAU, "hard")
    why = weight_why = "draws two paths from softmax(θ) at temperature 1, unrelaxed"

    def sample(self, theta, tau, hard):
        logits = stacked(theta)
        k = min(2, logits.shape[-1])
        idx = perturbed(logits.detach()).topk(k, -1).indices.sort(-1).values
        # p_i / (p_i + p_j): the renormalised probabilities (a pad drawn for a one-candidate
        # layer has θ = -inf, so weight 0; it is dropped from `active` below)
        w = torch.softmax(logits.gather(-1, idx), -1)
        m = unstack(torch.zeros_like(logits).scatter(-1, idx, w), theta)
        active = [[i for i in row if i < len(t)]
                  for row, t in zip(idx.tolist(), theta, strict=True)]
        probs = unstack(torch.softmax(logits, -1), theta)
        return PathSample(m, active, probs)


@MODES.register("reinforce")
class Reinforce(SearchMode):
    """Single paths, scored: a path i_l ~ softmax(θ_l) per layer (m one-hot, no gradient; only
    it computed), cost weights = softmax(θ) (the expected cost's exact gradient). A θ step
    draws `score_paths` paths on its batch and estimates ∇θ E[CE] by the score function with a
    leave-one-out baseline, (1/k) Σ_j (CE_j − mean_{j'≠j} CE_j') ∇θ log p(path_j) (REINFORCE;
    ProxylessNAS's non-differentiable variant). It measures which single paths are accurate,
    which a relaxation cannot where BatchNorm makes a layer's output scale-free (a candidate
    that outputs zeros only rescales the mixture). `tau` and `hard` are not used."""

    name, score_paths, single = "reinforce", 4, True
    ignores = weight_ignores = (*TAU, "hard")
    why = weight_why = "draws single paths by Gumbel-max at temperature 1"

    def draw(self, theta) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
        """(m, each layer's drawn index as an [L] tensor on θ's device, the cost weights): a
        path not yet read on the host (a θ step draws its k paths, then reads them at once)."""
        logits = stacked(theta)
        _, idx = argmax_one_hot(perturbed(logits.detach()))  # Gumbel-max: a draw from softmax
        m = unstack(torch.zeros_like(logits).scatter_(-1, idx, 1.0), theta)
        probs = unstack(torch.softmax(logits, -1), theta)
        return m, idx.squeeze(-1), probs

    def sample(self, theta, tau, hard):
        m, idx, probs = self.draw(theta)
        return PathSample(m, [[i] for i in idx.tolist()], probs)


def weight_sampler(mode: str, weight_sampling: str) -> str:
    """The mode the weight steps sample their paths in: `search.weight_sampling`, or with
    `mode` the search mode itself (the one place this rule is written)."""
    return mode if weight_sampling == "mode" else weight_sampling


def ignored_settings(mode: str, weight_sampling: str = "mode") -> tuple[str, ...]:
    """The `search:` settings a search in `mode`, its weight steps sampled by `weight_sampling`
    (`mode`: by the mode itself), never reads."""
    m = get_mode(mode)
    w = get_mode(weight_sampler(mode, weight_sampling))
    return tuple(k for k in m.ignores if k in w.weight_ignores)


def ignored_note(mode: str, weight_sampling: str, given: Collection[str]) -> str | None:
    """One line naming the settings in `given` (those a config sets) the search ignores."""
    keys = [k for k in ignored_settings(mode, weight_sampling) if k in given]
    if not keys:
        return None
    by, why = f"search.mode {mode}", f"{mode} {get_mode(mode).why}"
    if weight_sampling not in ("mode", mode):
        by += f" with weight_sampling {weight_sampling}"
        why += f"; {weight_sampling} {get_mode(weight_sampling).weight_why}"
    return f"note: {by} ignores {', '.join(f'search.{k}' for k in keys)} ({why})"


def path_log_prob(theta: Sequence[torch.Tensor], active: Sequence[Sequence[int]] | torch.Tensor
                  ) -> torch.Tensor:
    """log p(path) = Σ_l log softmax(θ_l)[i_l] of a single path (`active` one index per layer,
    or an [L] index tensor already on θ's device: no host copy)."""
    lp = torch.log_softmax(stacked(theta), -1)
    idx = (active if isinstance(active, torch.Tensor) else
           torch.tensor([a[0] for a in active], device=lp.device))
    return lp.gather(-1, idx.unsqueeze(-1)).sum()

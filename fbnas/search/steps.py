"""One step of each kind of the search (the SearchTrainer's steps, fbnas.trainer): weight
steps on the paths the mode (or `search.weight_sampling`, or a warm-up) samples, and θ steps
through the relaxation or, in a scored mode (`reinforce`), by the score function. Every step
goes through the one update of fbnas.training.step.

A mixin: it uses the trainer's model (`net`, `model`, `w_forward`), `stepper`, `prec`, `loss`,
optimizers, `noise`, `tau` and `cfg`, all set up by SearchTrainer._setup.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fbnas.blocks.shared import UsedSlices
from fbnas.search.modes import PathSample, path_log_prob, weight_sampler
from fbnas.search.schedules import warmup_paths
from fbnas.training.step import StepFigures, Update, metric


class SearchSteps:
    def _sample(self) -> PathSample:
        """The paths of one θ step, as search.mode samples them (on the ranks' shared
        noise)."""
        with self.noise():
            return self.net.sample_path(self.tau, self.cfg.search.hard)

    @property
    def _weight_mode(self) -> str | None:
        """The mode the weight steps sample in after the warm-up (None: search.mode)."""
        s = self.cfg.search
        w = weight_sampler(s.mode, s.weight_sampling)
        return None if w == s.mode else w

    def _w_update(self) -> Update:
        kernels = self.net.superkernels()
        sparse = (UsedSlices(kernels) if kernels and self.cfg.search.shared_update == "used"
                  else None)
        return Update(self.w_opt, self.net.weight_parameters(), 0, self.cfg.search.grad_clip,
                      ddp=self._ddp, averager=self._averager, sparse=sparse)

    def _warmup_paths(self) -> list[list[list[int]]] | None:
        """The single paths a warm-up weight step trains, or None (fbnas.search.schedules)."""
        if self.theta_active():
            return None
        return warmup_paths(self.cfg.search.warmup_sampling, [len(t) for t in self.net.theta])

    def _path_weight_step(self, x: torch.Tensor, y: torch.Tensor,
                          paths: list[list[list[int]]]) -> StepFigures:
        """One weight step on the given single paths, gradients summed over them (FairNAS: each
        candidate gets a whole step's update; the shared stem and head get K of them, which
        search.grad_clip bounds). With search.sandwich the dearest path comes first, on the
        labels, and the others learn from its soft outputs (in-place distillation)."""
        ce_sum = acc_sum = cost_sum = 0.0
        teacher = None
        if self.cfg.search.sandwich:
            paths = [[[i] for i in self.net.dearest_path()], *paths]
        with self.stepper.update(self._w_update()) as u:
            ces = []
            for path in paths:
                m, active = self.net.path([a[0] for a in path])
                with self.prec.autocast():
                    logits, cost = self.w_forward(self.prec.input(x), m=m, active=active,
                                                  cost_m=m)
                logits = logits.float()
                ce = self.loss.ce(logits, y)
                ces.append(ce)
                loss = ce if teacher is None else distillation(logits, teacher)
                if self.cfg.search.sandwich and teacher is None:
                    teacher = logits.detach()
                self.prec.scale(loss, 0).backward()
                ce_sum = ce_sum + metric(ce)
                acc_sum = acc_sum + metric((logits.detach().argmax(1) == y).float().mean())
                cost_sum = cost_sum + metric(cost)
            u.terms = {"ce": torch.stack(ces)}
        if not u.applied:
            return StepFigures()
        k = len(paths)
        return StepFigures({"ce": ce_sum / k, "acc": acc_sum / k, "cost": cost_sum / k},
                           skip=u.skip)

    def weight_step(self, x: torch.Tensor, y: torch.Tensor) -> StepFigures:
        self.model.train()
        paths = self._warmup_paths()
        if paths is not None:
            return self._path_weight_step(x, y, paths)
        # the mode decides which paths are sampled and computed; with search.uniform_paths
        # (bi-sampling) also that many uniform single paths, drawn on the same noise, so
        # every rank of a torchrun draws the same ones
        sizes = [len(t) for t in self.net.theta]
        with torch.no_grad(), self.noise():
            p = self.net.sample_path(self.tau, self.cfg.search.hard, self._weight_mode)
            extra = [warmup_paths("uniform", sizes)[0]
                     for _ in range(self.cfg.search.uniform_paths)]
        if extra or self.cfg.search.sandwich:
            return self._path_weight_step(x, y, [[list(a) for a in p.active], *extra])
        with self.stepper.update(self._w_update()) as u:
            with self.prec.autocast():
                logits, cost = self.w_forward(self.prec.input(x), m=p.m, active=p.active,
                                              cost_m=p.cost_m)
            logits = logits.float()  # the losses in float32 under any search.precision
            ce = self.loss.ce(logits, y)
            self.prec.scale(ce, 0).backward()
            u.terms = {"ce": ce}
        if not u.applied:
            return StepFigures()
        acc = (logits.detach().argmax(1) == y).float().mean()
        return StepFigures({"ce": metric(ce), "acc": metric(acc), "cost": metric(cost)},
                           skip=u.skip)

    def theta_step(self, x: torch.Tensor, y: torch.Tensor) -> StepFigures:
        self.model.train()
        if self.net.search_mode.score_paths:
            return self._score_theta_step(x, y, self.net.search_mode.score_paths)
        theta = self.net.arch_parameters()
        with self.stepper.update(Update(self.theta_opt, theta, 1, average=True)) as u, \
                frozen_weights(self.net.weight_parameters()):
            p = self._sample()
            with self.prec.autocast():
                logits, cost = self.model(self.prec.input(x), m=p.m, active=p.active,
                                          cost_m=p.cost_m)
            if self.loss.on_expected:  # Σ softmax(θ)·LAT: deterministic, reaches every θ
                cost = self.net.expected_cost([torch.softmax(t, -1) for t in self.net.theta])
            terms = self.loss(logits.float(), y, cost.float())
            # weights get no gradient here (frozen: no layer keeps its input for a weight
            # gradient). A layer's θ can be absent from the graph in a mode that computes only
            # the sampled candidate (single_path's sampler): a sampled identity `skip` in a
            # shortcut layer adds nothing (x + 0), and with `loss.kind: ce` nothing else
            # reaches that θ; its gradient is then 0.
            total = self.prec.scale(terms.total, 1)
            _set_grads(theta, total)
            u.terms = {"ce": terms.ce, "cost_term": terms.cost_term, "total": terms.total}
        if not u.applied:
            return StepFigures()
        acc = (logits.detach().argmax(1) == y).float().mean()
        return StepFigures({"loss": metric(terms.total), "ce": metric(terms.ce),
                            "cost_term": metric(terms.cost_term), "acc": metric(acc),
                            "cost": metric(cost)}, skip=u.skip)

    def _score_theta_step(self, x: torch.Tensor, y: torch.Tensor, k: int) -> StepFigures:
        """θ step of a scored mode (fbnas.search.modes.Reinforce): k single paths on this batch, the
        CE gradient by the score function with a leave-one-out baseline, the cost's exactly."""
        theta = self.net.arch_parameters()
        with self.stepper.update(Update(self.theta_opt, theta, 1, average=True)) as u:
            ces, logps, accs = [], [], []
            # the k paths drawn first, each on its own noise, then read on the host at once:
            # one sync, not k (the same paths as drawing one before each forward where a
            # forward draws no random number: a head without dropout, or under torchrun's
            # shared noise)
            draws = []
            for _ in range(k):
                with self.noise():
                    draws.append(self.net.search_mode.draw(self.net.theta))
            paths = torch.stack([idx for _, idx, _ in draws]).tolist()
            with torch.no_grad(), self.prec.autocast():  # one autocast region for the k
                xin = self.prec.input(x)
                stem = self.net.shared_stem(xin, k)  # the same input and weights: once
                outs = [self.model(xin, m=m, active=[[i] for i in path], cost_m=cost_m,
                                   stem=stem)[0]
                        for (m, _, cost_m), path in zip(draws, paths, strict=True)]
            for logits in outs:
                ces.append(self.loss.ce(logits.float(), y))
                accs.append((logits.argmax(1) == y).float().mean())
            for _, idx, _ in draws:  # the indices stay on the device
                logps.append(path_log_prob(theta, idx))
            ce, logp = torch.stack(ces), torch.stack(logps)
            adv = (ce - ce.mean()) * (k / max(k - 1, 1))  # CE_j − mean of the others
            score = (adv * logp).mean()
            # value: the paths' mean CE; gradient: the score-function estimate of ∇θ E[CE]
            est = ce.mean() + score - score.detach()
            cost = self.net.expected_cost([torch.softmax(t, -1) for t in theta])
            terms = self.loss.with_ce(est, cost.float())
            _set_grads(theta, self.prec.scale(terms.total, 1))
            u.terms = {"ce": ce, "cost_term": terms.cost_term, "total": terms.total}
        if not u.applied:
            return StepFigures()
        return StepFigures({"loss": metric(terms.total), "ce": metric(ce.mean()),
                            "cost_term": metric(terms.cost_term),
                            "acc": metric(torch.stack(accs).mean()), "cost": metric(cost)},
                           skip=u.skip)


def distillation(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) ‖ softmax(logits)), the batch's mean: in-place distillation."""
    return torch.nn.functional.kl_div(torch.log_softmax(logits, 1), torch.log_softmax(teacher, 1),
                                      reduction="batchmean", log_target=True)


@contextlib.contextmanager
def frozen_weights(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """`params` without requires_grad for the block (a θ step's forward and backward):
    autograd then saves no layer's input for a weight gradient, nor computes one."""
    was = [q.requires_grad for q in params]
    for q in params:
        q.requires_grad_(False)
    try:
        yield
    finally:
        for q, w in zip(params, was, strict=True):
            q.requires_grad_(w)


def _set_grads(theta: list[torch.Tensor], total: torch.Tensor) -> None:
    """θ's gradients of `total` (the weights get none); a θ absent from the graph, or a total
    that depends on no θ, gets a zero gradient."""
    grads = (torch.autograd.grad(total, theta, allow_unused=True) if total.requires_grad
             else [None] * len(theta))
    for t, g in zip(theta, grads, strict=True):
        t.grad = torch.zeros_like(t) if g is None else g

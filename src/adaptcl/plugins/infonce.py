"""InfoNCE / NT-Xent and the baselines that change one part of it: DCL, FlatNCE, Dual temperature.

References:
    - InfoNCE: van den Oord et al., "Representation Learning with Contrastive Predictive
      Coding", 2018. NT-Xent: Chen et al., "A Simple Framework for Contrastive Learning of
      Visual Representations" (SimCLR), ICML 2020.
    - DCL: Yeh et al., "Decoupled Contrastive Learning", ECCV 2022.
    - FlatNCE: Chen et al., "Simpler, Faster, Stronger: Breaking The log-K Curse On
      Contrastive Learners With FlatNCE", 2021.
    - Dual temperature: Zhang et al., "Dual Temperature Helps Contrastive Learning Without
      Many Negative Samples", CVPR 2022.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import check_positive, check_shared
from .base import ContrastiveLoss, Stats, run_kernel
from .candidates import build_candidates, rows_logits
from .distributed import GatherFn
from .kernel import no_negatives_output
from .tiled import tiled_negative_lse


def info_nce(z0: Tensor, z1: Tensor, temperature: float = 0.1, *, form: str = "nt_xent",
             negatives: Tensor | None = None, positive_in_denominator: bool = True,
             gather_distributed: bool = False, gather_fn: GatherFn | None = None,
             tile_size: int | None = None) -> Tensor:
    """InfoNCE / NT-Xent of the pairs ``(z0[i], z1[i])``; see :class:`InfoNCELoss`."""
    check_positive("temperature", temperature)
    _, _, _, tile_size = check_shared(gather_distributed=gather_distributed, gather_fn=gather_fn,
                                      check_finite=True, tile_size=tile_size)
    cands = build_candidates(z0, z1, form, negatives, gather_distributed=gather_distributed,
                             gather_fn=gather_fn)
    return run_kernel(cands, temperature, positive_in_denominator=positive_in_denominator,
                      tile_size=tile_size)[0]


def dcl(z0: Tensor, z1: Tensor, temperature: float = 0.1, *, form: str = "nt_xent",
        negatives: Tensor | None = None, gather_distributed: bool = False,
        gather_fn: GatherFn | None = None, tile_size: int | None = None) -> Tensor:
    """Decoupled contrastive loss: InfoNCE with the positive removed from the denominator."""
    return info_nce(z0, z1, temperature, form=form, negatives=negatives,
                    positive_in_denominator=False, gather_distributed=gather_distributed,
                    gather_fn=gather_fn, tile_size=tile_size)


class InfoNCELoss(ContrastiveLoss):
    """InfoNCE / NT-Xent loss.

    With the default ``form="nt_xent"`` this is exactly ``lightly.loss.NTXentLoss`` (symmetric,
    2N anchors, 2N - 2 negatives each). ``form="cross_view"`` is the one-direction form of
    SimCSE and sentence-transformers' ``MultipleNegativesRankingLoss``; ``form="queue"`` is MoCo.

    Args:
        temperature: softmax temperature tau > 0.
        form: candidate set, see :mod:`adaptcl.plugins.candidates`.
        positive_in_denominator: False gives DCL (see :class:`DCLLoss`).
        gather_distributed: gather candidates from every rank before the loss.
        gather_fn: custom gradient-carrying gather (e.g. ``lightly.utils.dist.gather``).
        check_finite: raise ``ValueError`` on NaN/inf embeddings (one cheap reduction).
        tile_size: stream the similarity matrix in ``tile_size x tile_size`` tiles with an exact
            recomputing backward (Inf-CL, Cheng et al. 2024; :mod:`adaptcl.plugins.tiled`):
            memory linear in the batch. ``None`` (default) materialises it.

    Examples:
        >>> loss_fn = InfoNCELoss(temperature=0.5)
        >>> z0, z1 = torch.randn(8, 32), torch.randn(8, 32)
        >>> loss = loss_fn(z0, z1)
        >>> big = InfoNCELoss(temperature=0.1, tile_size=4096)  # batches far beyond memory
    """

    def __init__(self, temperature: float = 0.1, *, form: str = "nt_xent",
                 positive_in_denominator: bool = True, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: int | None = None) -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size)
        self.temperature = check_positive("temperature", temperature)
        self.positive_in_denominator = bool(positive_in_denominator)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        return run_kernel(self.candidates(z0, z1, negatives), self.temperature,
                          positive_in_denominator=self.positive_in_denominator,
                          tile_size=self.tile_size)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, positive_in_denominator="
                f"{self.positive_in_denominator}, {super().extra_repr()}")


class DCLLoss(InfoNCELoss):
    """Decoupled contrastive loss (Yeh et al., ECCV 2022): the positive leaves the denominator.

    GraphCL's loss is this loss in ``form="cross_view"``. The gradient no longer carries MACL's
    scaling factor W (Huang et al. 2023, Sec. 5.2).

    Examples:
        >>> loss_fn = DCLLoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, *, form: str = "nt_xent",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: int | None = None) -> None:
        super().__init__(temperature, form=form, positive_in_denominator=False,
                         gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size)


class FlatNCELoss(ContrastiveLoss):
    """FlatNCE (Chen et al. 2021): ``exp(r - sg(r))`` with ``r = logsumexp_j (l_j - l_pos)``.

    Its value is always 1 (uninformative by construction) and its gradient equals DCL's;
    ``last_stats["plain_loss"]`` holds the InfoNCE value for monitoring. Anchors without
    negatives give 0 (no gradient), like every other loss here.

    Examples:
        >>> loss_fn = FlatNCELoss(temperature=0.1)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, *, form: str = "nt_xent",
                 gather_distributed: bool = False, gather_fn: GatherFn | None = None,
                 check_finite: bool = True, tile_size: int | None = None) -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size)
        self.temperature = check_positive("temperature", temperature)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        cands = self.candidates(z0, z1, negatives)
        losses, plains = [], []
        for c in cands:
            if c.num_negatives == 0:
                out = no_negatives_output(c.positive_sim)
                losses.append(out.loss)
                plains.append(out.plain)
                continue
            if self.tile_size is not None:
                lse, pos = tiled_negative_lse(c, self.temperature, self.tile_size)
                r = lse - pos
            else:
                neg, pos = rows_logits(c, self.temperature)
                r = torch.logsumexp(neg, dim=1) - pos
            losses.append(torch.exp(r - r.detach()))
            plains.append(torch.nn.functional.softplus(r.detach()))
        loss = torch.cat(losses).mean()
        stats = {"loss": loss.detach(), "plain_loss": torch.cat(plains).mean(),
                 "alignment": cands[0].positive_sim.detach().mean(),
                 "temperature": torch.tensor(self.temperature)}
        return loss, stats


class DualTemperatureLoss(ContrastiveLoss):
    """Dual temperature InfoNCE (Zhang et al., CVPR 2022): ``sg(W_beta / W_alpha) * L_alpha``.

    ``temperature`` (tau_alpha) shapes the intra-anchor hardness; ``temperature_beta`` sets
    the inter-anchor weight through ``W_beta = 1 - P_pos(tau_beta)``. Weights are computed in log
    space, so easy positives (W_alpha -> 0) do not overflow.

    Examples:
        >>> loss_fn = DualTemperatureLoss(temperature=0.1, temperature_beta=1.0)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
    """

    def __init__(self, temperature: float = 0.1, temperature_beta: float = 1.0, *,
                 form: str = "nt_xent", gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: int | None = None) -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size)
        self.temperature = check_positive("temperature", temperature)
        self.temperature_beta = check_positive("temperature_beta", temperature_beta)

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        cands = self.candidates(z0, z1, negatives)

        def log_weights(c, log_w_alpha: Tensor) -> Tensor:
            with torch.no_grad():
                if self.tile_size is not None:
                    lse, pos = tiled_negative_lse(c, self.temperature_beta, self.tile_size)
                else:
                    neg, pos = rows_logits(c, self.temperature_beta)
                    lse = torch.logsumexp(neg, dim=1)
                log_w_beta = torch.nn.functional.logsigmoid(lse - pos)
            return log_w_beta - log_w_alpha

        return run_kernel(cands, self.temperature, log_weights=log_weights, tile_size=self.tile_size)

"""Learnable temperature (CLIP's logit scale): InfoNCE whose temperature is a trained parameter.

References:
    - Radford et al., "Learning Transferable Visual Models From Natural Language Supervision"
      (CLIP), ICML 2021: the temperature is "directly optimized during training as a
      log-parameterized multiplicative scalar", initialised at 0.07 and clipped so the logits
      are not scaled by more than 100.
    - open_clip (github.com/mlfoundations/open_clip), read for the exact behaviour:
      ``CLIP.__init__`` creates ``logit_scale = nn.Parameter(torch.ones([]) *
      np.log(1 / 0.07))`` (``init_logit_scale``), the forward multiplies the logits by
      ``logit_scale.exp()`` without clamping, and the training loop clamps the parameter in
      place after every optimiser step: ``with torch.no_grad():
      model.logit_scale.clamp_(0, math.log(100))`` (``ImageTextTask.clamp_logit_scale``, called
      from ``train.py`` after ``optimizer.step()``; "we clamp to 4.6052 = ln(100), as in the
      original paper"). Its optimiser groups exclude ``logit_scale`` from weight decay.

This loss changes one part of InfoNCE, the temperature: ``tau = exp(-s)`` with ``s`` a
parameter (one per head with ``num_heads``), initialised at ``log(1 / temperature)``.

The clamp, done as open_clip does it. ``s`` is kept in ``[log(1 / max_temperature),
log(1 / min_temperature)]`` = ``[0, log 100]`` by default (tau in ``[0.01, 1]``). The loss
does not own the optimiser, so it clamps the parameter in place, without gradient and without
reading it on the host, at the start of every forward pass (a no-op unless an optimiser step or
a ``load_state_dict`` moved it out of the bounds): the forward pass then sees the same value as
open_clip's after its ``clamp_``, the gradient flows to ``s`` (as in open_clip, whose forward
has no clamp; at a bound too, see :func:`bounded_scale`) and the optimiser's next step starts
from the clamped value, so the trajectory of ``s`` is open_clip's. Two forward passes before
one backward (a symmetric loss, gradient accumulation) are fine: the graph keeps ``exp(-s)``
and the bounds' mask, never ``s`` itself. The forward pass also bounds ``s`` out of place (a
no-op on a clamped value), so the functional form's argument, and ``s`` under
``torch.compile`` (which skips the in-place clamp), are bounded too.

What a read between two steps shows. open_clip clamps right after ``optimizer.step()``, so its
``logit_scale`` is never seen out of bounds; here the raw parameter stays where the step put it
until the next forward pass. Every read of the value is the clamped one instead:
``state_dict()`` holds the clamped ``s`` (a state-dict hook clamps a copy; the parameter itself
is not touched, so reading never changes training), :attr:`LearnableTemperatureLoss.temperature`
is ``exp(-clamped s)`` and ``last_stats`` is what the forward used. A checkpoint written between
steps is therefore open_clip's, and resuming from it continues the same trajectory (the next
forward would have clamped to that value). Only the :attr:`~LearnableTemperatureLoss.logit_scale`
parameter, read directly, shows the raw value; call :meth:`LearnableTemperatureLoss.clamp_` right
after ``optimizer.step()`` to clamp it in place exactly when open_clip does.

Where the parameter goes. It is a parameter of the loss module: keep the loss inside the
module that is optimised (a LightningModule's ``self.criterion``, a GraphCL model's
``loss_fn``) or pass ``loss.parameters()`` to the optimiser; ``SentenceTransformerTrainer``
optimises the parameters of its loss. Exclude it from weight decay as open_clip does (weight
decay pulls ``s`` to 0, i.e. tau to 1).

Example:
    >>> model = nn.Linear(16, 8)
    >>> loss_fn = LearnableTemperatureLoss(temperature=0.07)
    >>> optimizer = torch.optim.SGD([{"params": model.parameters(), "weight_decay": 1e-4},
    ...                              {"params": loss_fn.parameters(), "weight_decay": 0.0}],
    ...                             lr=0.1)
    >>> x0, x1 = torch.randn(8, 16), torch.randn(8, 16)
    >>> loss = loss_fn(model(x0), model(x1))
    >>> loss.backward(); optimizer.step()    # s moves; the next forward clamps it
    >>> tau = loss_fn.last_stats["temperature"]   # exp(-s) of the step just taken
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import (
    ContrastiveLoss,
    Reduction,
    Stats,
    functional_candidates,
    loss_stats,
    per_anchor_losses,
    reduce,
)
from .candidates import Candidates, Form
from .distributed import GatherFn
from .heads import as_heads
from .validation import TileSize, check_int, check_positive, check_temperature_range

__all__ = ["LearnableTemperatureLoss", "learnable_temperature", "OPEN_CLIP_TEMPERATURE",
           "scale_bounds", "bounded_scale"]

#: CLIP's and open_clip's setting: initial tau 0.07 (``init_logit_scale = log(1 / 0.07)``),
#: ``logit_scale`` clamped to ``[0, log 100]``, i.e. tau in ``[0.01, 1]``
OPEN_CLIP_TEMPERATURE: dict[str, float] = {"temperature": 0.07, "min_temperature": 0.01,
                                           "max_temperature": 1.0}


def _learnable_options(min_temperature: float, max_temperature: float,
                       positive_in_denominator: bool) -> dict:
    """The bounds checked once for the module and the functional form."""
    low, high = check_temperature_range(min_temperature, max_temperature)
    return {"min_temperature": low, "max_temperature": high,
            "positive_in_denominator": bool(positive_in_denominator)}


def scale_bounds(min_temperature: float, max_temperature: float) -> tuple[float, float]:
    """``(lowest, highest)`` logit scale ``s = log(1 / tau)`` for tau in ``[min, max]``
    (open_clip's ``(0, log 100)`` for ``(0.01, 1)``)."""
    return math.log(1.0 / max_temperature), math.log(1.0 / min_temperature)


def bounded_scale(logit_scale: Tensor, low: float, high: float) -> Tensor:
    """``logit_scale`` clamped to ``[low, high]`` with the gradient of the value used: 1 inside
    the bounds, the bounds included, 0 outside. (``torch.clamp``'s gradient is 0 at a bound
    too, which would freeze ``s`` once open_clip's in-place clamp has put it there.)"""
    inside = (logit_scale >= low) & (logit_scale <= high)
    return torch.where(inside, logit_scale, logit_scale.detach().clamp(low, high))


def _learnable(z0: Tensor, z1: Tensor, negatives: Tensor | None, build, logit_scale: Tensor, *,
               min_temperature: float, max_temperature: float, positive_in_denominator: bool,
               tile_size: TileSize) -> tuple[Tensor, Stats]:
    """Per-anchor losses (summed over heads) at ``tau = exp(-clamp(s))``, and the statistics;
    ``build(z0, z1, negatives)`` makes one head's candidates."""
    heads = logit_scale.numel()
    multi = heads > 1 or z0.ndim == 3 or (negatives is not None and negatives.ndim == 3)
    if multi:
        z0, z1 = as_heads("z0", z0), as_heads("z1", z1)
        if z0.shape != z1.shape:
            raise ValueError(f"z0 and z1 must have the same shape, got {tuple(z0.shape)} and "
                             f"{tuple(z1.shape)}")
        if z0.shape[0] != heads:
            raise ValueError(f"z0 has {z0.shape[0]} head(s) ([heads, batch, dim]) but the loss "
                             f"has {heads} temperature(s) (num_heads={heads})")
        if negatives is not None:
            negatives = as_heads("negatives", negatives)
            if negatives.shape[0] != heads:
                raise ValueError("negatives must have one [K, D] set per head, got "
                                 f"{negatives.shape[0]} for {heads} heads")
    low, high = scale_bounds(min_temperature, max_temperature)
    tau = torch.exp(-bounded_scale(logit_scale, low, high)).reshape(-1)
    if not multi:
        return per_anchor_losses(build(z0, z1, negatives), tau[0], method="LearnableTemperature",
                                 tile_size=tile_size,
                                 positive_in_denominator=positive_in_denominator)
    total, per_head = 0.0, []
    for h in range(heads):
        cands = build(z0[h], z1[h], None if negatives is None else negatives[h])
        # every head's matrices live until the backward (each head plans the same)
        losses, stats = per_anchor_losses(cands, tau[h], method="LearnableTemperature",
                                          tile_size=tile_size, heads=heads,
                                          positive_in_denominator=positive_in_denominator)
        total = total + losses
        per_head.append(stats)
    # heads add up (AMCL's l = sum_c l_c): so do their unweighted losses; the rest is a mean
    extra = {}
    for key in per_head[0].keys() - {"loss", "temperature"}:
        values = torch.stack([stats[key] for stats in per_head])
        extra[key] = values.sum() if key == "plain_loss" else values.mean()
    return total, loss_stats(total, temperature=tau, **extra)


class LearnableTemperatureLoss(ContrastiveLoss):
    """InfoNCE with a learned temperature ``tau = exp(-s)`` (CLIP; open_clip's ``logit_scale``).

    ``s`` (:attr:`logit_scale`) starts at ``log(1 / temperature)`` and is clamped to
    ``[log(1 / max_temperature), log(1 / min_temperature)]`` as open_clip clamps it (module
    docstring). Before any update it is InfoNCE at ``exp(-log(1 / temperature))`` (the
    temperature up to one rounding of ``exp``; exactly ``InfoNCELoss(float(loss.temperature))``).

    Args:
        temperature: the initial tau (CLIP: 0.07), within the bounds.
        min_temperature: lowest tau (open_clip: 0.01, i.e. ``logit_scale <= log 100``).
        max_temperature: highest tau (open_clip: 1, i.e. ``logit_scale >= 0``).
        num_heads: one learned temperature per projection head; the loss then takes
            ``[heads, N, D]`` inputs (as :class:`~adaptcl.plugins.AMCLLoss`, e.g. from a
            :class:`~adaptcl.plugins.MultiHeadProjection`) and adds the heads' losses. With
            one head (the default) ``s`` is a 0-d parameter, as open_clip's, and inputs are
            ``[N, D]`` (``[1, N, D]`` is accepted).

    ``form``, ``positive_in_denominator``, ``gather_distributed``, ``gather_fn``,
    ``check_finite``, ``tile_size`` and ``reduction`` are as in
    :class:`~adaptcl.plugins.InfoNCELoss`. Gathered candidates carry no temperature (it is
    folded into the local anchors), so each rank's gradient wrt ``s`` is that of its own
    anchors' terms and DDP's average over ranks is the full batch's gradient.

    ``"cross_view_symmetric"`` is CLIP's loss (both directions averaged); with it the value is
    open_clip's ``ClipLoss`` at ``logit_scale = exp(s)``. After each call ``last_stats`` holds
    ``loss``, ``plain_loss``, ``alignment``, ``temperature`` (tau, mean over heads),
    ``mean_w`` and ``positive_probability``.

    Examples:
        >>> loss_fn = LearnableTemperatureLoss(0.07)
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32))
        >>> loss.backward()
        >>> loss_fn.logit_scale.grad is not None
        True
        >>> per_head = LearnableTemperatureLoss(0.1, num_heads=3)    # [3, N, D] inputs
    """

    def __init__(self, temperature: float = 0.07, *, min_temperature: float = 0.01,
                 max_temperature: float = 1.0, num_heads: int = 1, form: Form = "nt_xent",
                 positive_in_denominator: bool = True, gather_distributed: bool = False,
                 gather_fn: GatherFn | None = None, check_finite: bool = True,
                 tile_size: TileSize = "auto", reduction: Reduction = "mean") -> None:
        super().__init__(form=form, gather_distributed=gather_distributed, gather_fn=gather_fn,
                         check_finite=check_finite, tile_size=tile_size, reduction=reduction)
        options = _learnable_options(min_temperature, max_temperature, positive_in_denominator)
        for name, value in options.items():
            setattr(self, name, value)
        temperature = check_positive("temperature", temperature)
        if not self.min_temperature <= temperature <= self.max_temperature:
            raise ValueError(f"temperature must lie in [min_temperature, max_temperature] = "
                             f"[{self.min_temperature}, {self.max_temperature}], got {temperature}")
        self.num_heads = check_int("num_heads", num_heads, 1)
        #: the temperature ``s`` started from (``log(1 / initial_temperature)``)
        self.initial_temperature = temperature
        shape = () if num_heads == 1 else (num_heads,)
        #: s = log(1 / tau), open_clip's ``logit_scale`` (one per head)
        self.logit_scale = nn.Parameter(torch.full(shape, math.log(1.0 / temperature)))
        self.register_state_dict_post_hook(_clamped_in_state_dict)

    @property
    def temperature(self) -> Tensor:
        """The current tau, ``exp(-s)`` of the clamped ``s`` (detached; one per head)."""
        low, high = scale_bounds(self.min_temperature, self.max_temperature)
        return torch.exp(-self.logit_scale.detach().clamp(low, high))

    @torch.no_grad()
    def clamp_(self) -> LearnableTemperatureLoss:
        """Clamp ``s`` in place, as open_clip does after every ``optimizer.step()``."""
        self.logit_scale.clamp_(*scale_bounds(self.min_temperature, self.max_temperature))
        return self

    def compute(self, z0: Tensor, z1: Tensor, negatives: Tensor | None) -> tuple[Tensor, Stats]:
        if not torch.compiler.is_compiling():  # compiled, the out-of-place bound alone holds
            self.clamp_()  # open_clip's clamp after the last optimiser step
        return _learnable(z0, z1, negatives, self.candidates, self.logit_scale,
                          min_temperature=self.min_temperature,
                          max_temperature=self.max_temperature,
                          positive_in_denominator=self.positive_in_denominator,
                          tile_size=self.tile_size)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, min_temperature={self.min_temperature}, "
                f"max_temperature={self.max_temperature}, positive_in_denominator="
                f"{self.positive_in_denominator}, {super().extra_repr()}")


def _clamped_in_state_dict(module: LearnableTemperatureLoss, state_dict: dict, prefix: str,
                           local_metadata: dict) -> None:
    """``state_dict`` post-hook: the saved ``s`` is the clamped one, as open_clip's after its
    ``clamp_`` (a copy; ``keep_vars=True`` keeps the parameter itself)."""
    key = prefix + "logit_scale"
    value = state_dict.get(key)
    if value is not None and not isinstance(value, nn.Parameter):
        state_dict[key] = value.clamp(*scale_bounds(module.min_temperature,
                                                    module.max_temperature))


def learnable_temperature(z0: Tensor, z1: Tensor, logit_scale: Tensor, *,
                          min_temperature: float = 0.01, max_temperature: float = 1.0,
                          negatives: Tensor | None = None, form: Form = "nt_xent",
                          positive_in_denominator: bool = True, gather_distributed: bool = False,
                          gather_fn: GatherFn | None = None, check_finite: bool = True,
                          tile_size: TileSize = "auto",
                          reduction: Reduction = "mean") -> Tensor:
    """Functional learnable temperature at ``tau = exp(-clamp(logit_scale))``; arguments as
    :class:`LearnableTemperatureLoss`, with the parameter ``s`` passed in (0-d, or one per head
    for ``[heads, N, D]`` inputs), as open_clip's ``ClipLoss`` takes ``logit_scale``.

    The clamp here is out of place (``logit_scale`` is not modified; the gradient is zero
    outside the bounds): clamping the parameter after each optimiser step is the caller's job,
    as in open_clip, or the module's (:class:`LearnableTemperatureLoss`).

    Examples:
        >>> s = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        >>> loss = learnable_temperature(torch.randn(8, 32), torch.randn(8, 32), s)
    """
    if not isinstance(logit_scale, Tensor):
        raise TypeError(f"logit_scale must be a tensor (the parameter s = log(1 / tau)), got "
                        f"{type(logit_scale).__name__}")
    if logit_scale.ndim > 1:
        raise ValueError(f"logit_scale must be 0-d or [heads], got shape {tuple(logit_scale.shape)}")
    options = _learnable_options(min_temperature, max_temperature, positive_in_denominator)

    def build(a: Tensor, b: Tensor, neg: Tensor | None) -> list[Candidates]:
        return functional_candidates(a, b, neg, form=form, gather_distributed=gather_distributed,
                                     gather_fn=gather_fn, check_finite=check_finite,
                                     tile_size=tile_size,
                                     reduction=reduction)

    per_anchor, _ = _learnable(z0, z1, negatives, build, logit_scale, **options,
                               tile_size=tile_size)
    return reduce(per_anchor, reduction)

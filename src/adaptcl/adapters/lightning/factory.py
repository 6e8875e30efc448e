"""Build a Lightning self-supervised module, its transforms and its Trainer from names.

What a script needs to go from "SimCLR with MACL on CIFAR-10" to ``trainer.fit``:

- :func:`build_ssl_module`: the :mod:`~adaptcl.adapters.lightning.modules` module of a method
  (``"simclr"``, ``"moco"``, ``"simsiam"``, ``"barlowtwins"``, ``"ascl-moco"``) trained with
  a loss given by name (:data:`~adaptcl.adapters.lightning.methods.METHOD_LOSSES`), with
  Lightly's heads, AMCL's multi-heads where the loss needs them, and the MoCo queue as the
  loss's (checkpointed) memory bank; its settings are one typed object,
  :class:`~adaptcl.adapters.lightning.settings.SSLModuleSettings` (or its fields as keywords);
- :func:`ssl_transforms`: the two-view training transform of MACL App. B.3 (Lightly's
  ``SimCLRTransform`` without blur, or :class:`~adaptcl.adapters.lightly.ASCLTransform`) and
  the evaluation transform;
- Lightning's ``Trainer`` for a device string and the clock of a run:
  :mod:`adaptcl.adapters.lightning.trainer` (shared with GraphCL's Lightning module).

References: MACL (Huang et al., ICML 2023, App. B.2-B.3), AMCL and ASCL (Feng & Patras,
ICPR 2022).

Example:
    >>> from adaptcl.adapters.lightning import SSLModuleSettings
    >>> from adaptcl.adapters.lightning.factory import build_ssl_module, ssl_transforms
    >>> settings = SSLModuleSettings(width=0.125, temperature=0.1, alpha=0.5)
    >>> module = build_ssl_module("simclr", "macl", settings)
    >>> same = build_ssl_module("simclr", "macl", width=0.125, temperature=0.1, alpha=0.5)
    >>> train_tf, eval_tf = ssl_transforms("simclr", input_size=32)
    >>> type(module).__name__, type(module.criterion).__name__
    ('SimCLRModule', 'MACLLoss')
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from adaptcl.adapters import require
from adaptcl.adapters.lightning.settings import SSLModuleSettings

require("lightly", "vision")
pl = require("pytorch_lightning", "vision")

from adaptcl.adapters import lightly as L  # noqa: E402
from adaptcl.adapters.lightning import modules as M  # noqa: E402
from adaptcl.adapters.lightning.backbones import cifar_resnet  # noqa: E402
from adaptcl.adapters.lightning.base import SSLModule  # noqa: E402
from adaptcl.adapters.lightning.methods import (  # noqa: E402
    METHOD_LOSSES,
    METHODS,
    Method,
    check_method_loss,
)

__all__ = ["METHODS", "METHOD_LOSSES", "build_ssl_module", "ssl_transforms"]

_MODULES = {"simclr": M.SimCLRModule, "moco": M.MoCoV2Module, "simsiam": M.SimSiamModule,
            "barlowtwins": M.BarlowTwinsModule}


def build_ssl_module(method: Method, loss: str, settings: SSLModuleSettings | None = None,
                     **kwargs: Any) -> SSLModule:
    """The Lightning module of ``method`` trained with the loss named ``loss``.

    ``settings`` (:class:`~adaptcl.adapters.lightning.settings.SSLModuleSettings`, default its
    defaults) holds the backbone, heads, every loss's hyper-parameters, the optimiser and the
    kNN monitor; each loss reads the fields it needs. ``kwargs`` that name a field of it replace
    that field (``build_ssl_module("simclr", "macl", width=0.125)`` is ``build_ssl_module(
    "simclr", "macl", SSLModuleSettings(width=0.125))``); the others go to the method's
    :class:`~adaptcl.adapters.lightning.base.SSLModule` (``momentum``, ``lr_schedule``,
    ``warmup_epochs``, ``knn_bank_loader``, ...).

    The backbone is Lightly's CIFAR ResNet. AMCL's multi-heads wrap the method's own Lightly
    head; for ``"dystress"`` ``temperature`` is tau_min and ``dystress_max_temperature`` tau_max
    (default ``2 * temperature``: the DySTreSS authors' SimCLR setting 0.1 and 0.2 at the default
    ``temperature``). ``"temperature_schedule"`` runs Kukleva et al.'s cosine from
    ``temperature`` (tau_min; their 0.1) up to ``max_temperature`` (their 1.0) with ``period``
    steps (their 400, counted here in optimisation steps: the module's ``global_step`` drives
    it); ``"learnable_temperature"`` learns tau = exp(-s) from ``temperature``, within
    open_clip's bounds [0.01, 1]. MoCo's queue (``queue_size`` x ``output_dim``) is the loss's
    memory bank, kept in checkpoints. For ``"ascl-moco"`` the loss names the mode: ``"ascl"``,
    ``"ahcl"``, ``"hard"``, or ``"infonce"`` (plain MoCo: ASCL without neighbours). Loss names
    are the registry's (:mod:`adaptcl.registry`); the older spellings (``"nt_xent"``,
    ``"dual"``, ``"moco"``, ...) build the same module with a ``FutureWarning``.
    """
    s, module_kwargs = _settings(settings, kwargs)
    loss = check_method_loss(method, loss)
    net, feature_dim = cifar_resnet(s.backbone, width=s.width)
    module_kwargs = s.training_options() | module_kwargs
    hid, out = s.hidden_dim, s.output_dim
    if method == "ascl-moco":
        mode, k = (loss, s.num_neighbors) if loss != "infonce" else ("ascl", 0)
        return M.ASCLMoCoModule(net, feature_dim, hidden_dim=hid, output_dim=out,
                                queue_size=s.queue_size, temperature=s.temperature,
                                sharpen_temperature=s.sharpen_temperature, num_neighbors=k,
                                mode=mode, gather_distributed=s.gather_distributed,
                                tile_size=s.tile_size, **module_kwargs)
    module = _MODULES[method]
    if loss == "amcl":
        return _amcl_module(method, s, net, feature_dim, module_kwargs)
    if method == "simsiam":  # Lightly's NegativeCosineSimilarity
        return module(net, feature_dim, None, hidden_dim=hid, output_dim=out,
                      prediction_dim=max(1, out // 4), **module_kwargs)
    if method == "barlowtwins":  # Lightly's BarlowTwinsLoss
        return module(net, feature_dim, None, hidden_dim=hid, output_dim=out, **module_kwargs)
    return module(net, feature_dim, _criterion(loss, s, _queue(method, s)), hidden_dim=hid,
                  output_dim=out, **module_kwargs)


def _settings(settings: SSLModuleSettings | None,
              kwargs: dict[str, Any]) -> tuple[SSLModuleSettings, dict[str, Any]]:
    """(``settings`` with the fields ``kwargs`` name replaced, the other ``kwargs``)."""
    if settings is not None and not isinstance(settings, SSLModuleSettings):
        raise TypeError(f"settings must be an SSLModuleSettings, got {type(settings).__name__}")
    names = SSLModuleSettings.field_names()
    fields = {k: v for k, v in kwargs.items() if k in names}
    rest = {k: v for k, v in kwargs.items() if k not in names}
    return replace(settings or SSLModuleSettings(), **fields), rest


def _queue(method: Method, s: SSLModuleSettings) -> dict[str, Any]:
    """The memory-bank keywords of a loss: MoCo's queue, saved in checkpoints so that a resumed
    run keeps it; none for the in-batch methods (and the loss's ``tile_size``)."""
    bank = (s.queue_size, s.output_dim) if method == "moco" else 0
    return dict(memory_bank_size=bank, gather_distributed=s.gather_distributed,
                persistent_memory_bank=bool(bank), tile_size=s.tile_size)


def _amcl_module(method: Method, s: SSLModuleSettings, net: Any, feature_dim: int,
                 module_kwargs: dict[str, Any]) -> SSLModule:
    """``method`` with AMCL: its multi-heads around the method's own Lightly head(s)."""
    from lightly.models.modules.heads import (
        BarlowTwinsProjectionHead,
        MoCoProjectionHead,
        SimCLRProjectionHead,
        SimSiamPredictionHead,
        SimSiamProjectionHead,
    )

    from adaptcl.plugins import AMCLBarlowTwinsLoss, AMCLSimSiamLoss, PairTemperature

    module, out = _MODULES[method], s.output_dim
    head = {"simclr": SimCLRProjectionHead, "moco": MoCoProjectionHead,
            "simsiam": SimSiamProjectionHead, "barlowtwins": BarlowTwinsProjectionHead}[method]
    heads = L.AMCLProjectionHead.from_lightly(head, num_heads=s.num_heads, input_dim=feature_dim,
                                              hidden_dim=s.hidden_dim, output_dim=out)
    if method == "simsiam":
        pred = L.AMCLProjectionHead.from_lightly(
            SimSiamPredictionHead, num_heads=s.num_heads, input_dim=out,
            hidden_dim=max(1, out // 4), output_dim=out)
        return module(net, feature_dim, AMCLSimSiamLoss(PairTemperature(out), s.beta),
                      projection_head=heads, prediction_head=pred, output_dim=out,
                      **module_kwargs)
    if method == "barlowtwins":
        criterion = AMCLBarlowTwinsLoss(PairTemperature(out), s.beta)
    else:
        criterion = L.AMCLLoss(out, s.beta, s.negative_term, s.kappa, s.amcl_objective,
                               num_heads=s.num_heads,
                               **(_queue(method, s) if method == "moco" else
                                  {"gather_distributed": s.gather_distributed,
                                   "tile_size": s.tile_size}))
    return module(net, feature_dim, criterion, projection_head=heads, **module_kwargs)


def _criterion(loss: str, s: SSLModuleSettings, queue: dict[str, Any]) -> Any:
    """The Lightly-style loss named ``loss`` of ``s`` (a contrastive method's)."""
    tau = s.temperature
    criteria = {
        "infonce": lambda: L.NTXentLoss(tau, **queue),
        "macl": lambda: L.MACLLoss(s.macl_temperature or tau, s.alpha, s.a0, **queue),
        "dcl": lambda: L.DCLLoss(tau, **queue),
        "flatnce": lambda: L.FlatNCELoss(tau, **queue),
        "dual_temperature": lambda: L.DualTemperatureLoss(tau, 1.0, **queue),
        "ascl": lambda: L.ASCLLoss(tau, s.sharpen_temperature, s.num_neighbors, **queue),
        "dystress": lambda: L.DySTreSSLoss(tau, s.dystress_max_temperature or 2 * tau, **queue),
        "temperature_schedule": lambda: L.TemperatureScheduleLoss(tau, s.max_temperature,
                                                                  s.period, **queue),
        "learnable_temperature": lambda: L.LearnableTemperatureLoss(tau, **queue),
    }
    return criteria[loss]()


def ssl_transforms(method: Method, input_size: int = 32,
                   normalize: dict[str, list[float]] | None = None):
    """(two-view training transform, evaluation transform) for ``method``.

    Training: MACL App. B.3's crop-resize, colour jitter (strength 0.5), flip and grayscale
    without blur (Lightly's ``SimCLRTransform``), or ASCL's strong/weak pair
    (:class:`~adaptcl.adapters.lightly.ASCLTransform`) for ``"ascl-moco"``. Evaluation:
    resize, centre crop, normalise. ``normalize`` defaults to CIFAR-10's statistics.
    """
    from lightly.transforms import SimCLRTransform
    from lightly.transforms.torchvision_v2_compatibility import torchvision_transforms as T

    normalize = normalize if normalize is not None else L.CIFAR10_NORMALIZE
    if method == "ascl-moco":
        train = L.ASCLTransform(input_size=input_size, gaussian_blur=0.0, normalize=normalize)
    else:
        train = SimCLRTransform(input_size=input_size, cj_strength=0.5, gaussian_blur=0.0,
                                normalize=normalize)
    evaluation = T.Compose([T.Resize(input_size), T.CenterCrop(input_size), T.ToTensor(),
                            T.Normalize(mean=normalize["mean"], std=normalize["std"])])
    return train, evaluation

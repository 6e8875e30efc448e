"""Build a Lightning self-supervised module, its transforms and its Trainer from names.

What a script needs to go from "SimCLR with MACL on CIFAR-10" to ``trainer.fit``:

- :func:`build_ssl_module`: the :mod:`~adaptcl.adapters.lightning.modules` module of a method
  (``"simclr"``, ``"moco"``, ``"simsiam"``, ``"barlowtwins"``, ``"ascl-moco"``) trained with
  a loss given by name (:data:`~adaptcl.adapters.lightning.methods.METHOD_LOSSES`), with Lightly's heads, AMCL's multi-heads where
  the loss needs them, and the MoCo queue as the loss's (checkpointed) memory bank;
- :func:`ssl_transforms`: the two-view training transform of MACL App. B.3 (Lightly's
  ``SimCLRTransform`` without blur, or :class:`~adaptcl.adapters.lightly.ASCLTransform`) and
  the evaluation transform;
- Lightning's ``Trainer`` for a device string and the clock of a run:
  :mod:`adaptcl.adapters.lightning.trainer` (shared with GraphCL's Lightning module).

References: MACL (Huang et al., ICML 2023, App. B.2-B.3), AMCL and ASCL (Feng & Patras,
ICPR 2022).

Example:
    >>> from adaptcl.adapters.lightning.factory import build_ssl_module, ssl_transforms
    >>> module = build_ssl_module("simclr", "macl", width=0.125, temperature=0.1)
    >>> train_tf, eval_tf = ssl_transforms("simclr", input_size=32)
    >>> type(module).__name__, type(module.criterion).__name__
    ('SimCLRModule', 'MACLLoss')
"""

from __future__ import annotations

from typing import Any

from adaptcl.adapters import require
from adaptcl.plugins.amcl import NegativeTerm, Objective

require("lightly", "vision")
pl = require("pytorch_lightning", "vision")

from adaptcl.adapters import lightly as L  # noqa: E402
from adaptcl.adapters.lightning import modules as M  # noqa: E402
from adaptcl.adapters.lightning.methods import (  # noqa: E402
    METHOD_LOSSES,
    METHODS,
    Backbone,
    Method,
    check_method_loss,
)

__all__ = ["METHODS", "METHOD_LOSSES", "build_ssl_module", "ssl_transforms"]

_MODULES = {"simclr": M.SimCLRModule, "moco": M.MoCoV2Module, "simsiam": M.SimSiamModule,
            "barlowtwins": M.BarlowTwinsModule}


def build_ssl_module(method: Method, loss: str, *, backbone: Backbone = "resnet-18",
                     width: float = 1.0,
                     hidden_dim: int = 512, output_dim: int = 128, temperature: float = 0.1,
                     macl_temperature: float | None = None, alpha: float = 0.5,
                     a0: float = 0.0, num_heads: int = 2, beta: float = 1e-3, kappa: int = 1,
                     negative_term: NegativeTerm = "softmax", amcl_objective: Objective = "nt_xent",
                     queue_size: int = 4096, num_neighbors: int = 1,
                     sharpen_temperature: float = 0.05,
                     dystress_max_temperature: float | None = None,
                     max_temperature: float = 1.0, period: int = 400,
                     gather_distributed: bool = False, **module_kwargs: Any) -> M.SSLModule:
    """The Lightning module of ``method`` trained with the loss named ``loss``.

    The backbone is Lightly's CIFAR ResNet (:func:`~adaptcl.adapters.lightning.modules.
    cifar_resnet`, ``backbone`` and ``width``). ``temperature`` is tau of the fixed-temperature
    losses (and ASCL-MoCo's), ``macl_temperature`` MACL's tau0 (default ``temperature``),
    ``alpha``/``a0`` MACL's, ``num_heads``/``beta``/``kappa``/``negative_term``/
    ``amcl_objective`` AMCL's (its multi-heads wrap the method's own Lightly head),
    ``num_neighbors``/``sharpen_temperature`` ASCL's; for ``"dystress"`` ``temperature`` is
    tau_min and ``dystress_max_temperature`` tau_max (default ``2 * temperature``: the DySTreSS
    authors' SimCLR setting 0.1 and 0.2 at the default ``temperature``).
    ``"temperature_schedule"`` runs Kukleva et al.'s cosine from ``temperature`` (tau_min; their
    0.1) up to ``max_temperature`` (their 1.0) with ``period`` steps (their 400, counted here in
    optimisation steps: the module's ``global_step`` drives it); ``"learnable_temperature"``
    learns tau = exp(-s) from ``temperature``, within open_clip's bounds [0.01, 1].
    MoCo's queue (``queue_size`` x ``output_dim``) is the loss's memory bank, kept in
    checkpoints. ``gather_distributed`` gathers negatives across DDP ranks.
    ``module_kwargs`` go to :class:`~adaptcl.adapters.lightning.modules.SSLModule`
    (``optimizer``, ``lr``, ``weight_decay``, ``num_classes``, ``knn_k``, ``knn_t``, ...).
    For ``"ascl-moco"`` the loss names the mode: ``"ascl"``, ``"ahcl"``, ``"hard"``, or
    ``"infonce"`` (plain MoCo: ASCL without neighbours). Loss names are the registry's
    (:mod:`adaptcl.registry`); the older spellings (``"nt_xent"``, ``"dual"``,
    ``"moco"``, ...) build the same module with a ``FutureWarning``.
    """
    from lightly.models.modules.heads import (
        BarlowTwinsProjectionHead,
        MoCoProjectionHead,
        SimCLRProjectionHead,
        SimSiamPredictionHead,
        SimSiamProjectionHead,
    )

    from adaptcl.plugins import AMCLBarlowTwinsLoss, AMCLSimSiamLoss, PairTemperature

    loss = check_method_loss(method, loss)
    net, feature_dim = M.cifar_resnet(backbone, width=width)
    hid, out = hidden_dim, output_dim
    if method == "ascl-moco":
        mode, k = (loss, num_neighbors) if loss != "infonce" else ("ascl", 0)
        return M.ASCLMoCoModule(net, feature_dim, hidden_dim=hid, output_dim=out,
                                queue_size=queue_size, temperature=temperature,
                                sharpen_temperature=sharpen_temperature, num_neighbors=k,
                                mode=mode, gather_distributed=gather_distributed,
                                **module_kwargs)
    bank = (queue_size, out) if method == "moco" else 0
    # the MoCo queue is saved in checkpoints so that a resumed run keeps it
    queue = dict(memory_bank_size=bank, gather_distributed=gather_distributed,
                 persistent_memory_bank=bool(bank))
    module = _MODULES[method]
    if loss == "amcl":
        head = {"simclr": SimCLRProjectionHead, "moco": MoCoProjectionHead,
                "simsiam": SimSiamProjectionHead, "barlowtwins": BarlowTwinsProjectionHead}[method]
        heads = L.AMCLProjectionHead.from_lightly(head, num_heads=num_heads,
                                                  input_dim=feature_dim, hidden_dim=hid,
                                                  output_dim=out)
        if method == "simsiam":
            pred = L.AMCLProjectionHead.from_lightly(
                SimSiamPredictionHead, num_heads=num_heads, input_dim=out,
                hidden_dim=max(1, out // 4), output_dim=out)
            return module(net, feature_dim, AMCLSimSiamLoss(PairTemperature(out), beta),
                          projection_head=heads, prediction_head=pred, output_dim=out,
                          **module_kwargs)
        if method == "barlowtwins":
            criterion = AMCLBarlowTwinsLoss(PairTemperature(out), beta)
        else:
            criterion = L.AMCLLoss(out, beta, negative_term, kappa, amcl_objective,
                                   num_heads=num_heads,
                                   **(queue if method == "moco" else
                                      {"gather_distributed": gather_distributed}))
        return module(net, feature_dim, criterion, projection_head=heads, **module_kwargs)
    if method == "simsiam":  # Lightly's NegativeCosineSimilarity
        return module(net, feature_dim, None, hidden_dim=hid, output_dim=out,
                      prediction_dim=max(1, out // 4), **module_kwargs)
    if method == "barlowtwins":  # Lightly's BarlowTwinsLoss
        return module(net, feature_dim, None, hidden_dim=hid, output_dim=out, **module_kwargs)
    criteria = {
        "infonce": lambda: L.NTXentLoss(temperature, **queue),
        "macl": lambda: L.MACLLoss(macl_temperature or temperature, alpha, a0, **queue),
        "dcl": lambda: L.DCLLoss(temperature, **queue),
        "flatnce": lambda: L.FlatNCELoss(temperature, **queue),
        "dual_temperature": lambda: L.DualTemperatureLoss(temperature, 1.0, **queue),
        "ascl": lambda: L.ASCLLoss(temperature, sharpen_temperature, num_neighbors, **queue),
        "dystress": lambda: L.DySTreSSLoss(temperature, dystress_max_temperature or 2 * temperature,
                                           **queue),
        "temperature_schedule": lambda: L.TemperatureScheduleLoss(temperature, max_temperature,
                                                                  period, **queue),
        "learnable_temperature": lambda: L.LearnableTemperatureLoss(temperature, **queue),
    }
    return module(net, feature_dim, criteria[loss](), hidden_dim=hid, output_dim=out,
                  **module_kwargs)


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

"""Adaptive contrastive losses in sentence-transformers' own loss form, and SimCSE.

Each loss takes the model first, is called by ``SentenceTransformerTrainer`` as
``loss(sentence_features, labels)``, exposes ``compute_loss_from_embeddings``,
``get_config_dict`` (shown in the model card), ``citation`` and ``gather_across_devices``, and
reads its columns like ``MultipleNegativesRankingLoss``: ``(anchor, positive)`` pairs, optionally
followed by hard-negative columns. The maths lives in :mod:`adaptcl.plugins`.

Organised by job:

- :mod:`.losses` -- :class:`InfoNCELoss`, :class:`MACLLoss`, :class:`ASCLLoss`,
  :class:`AMCLLoss`, :class:`DySTreSSLoss` (with the peer's ``hardness_mode`` and, through
  ``use_labels=True``, the dataset's classes as multi-positive targets);
- :mod:`.temperatures` -- :class:`TemperatureScheduleLoss` (driven by the trainer's step) and
  :class:`LearnableTemperatureLoss` (CLIP's learned temperature);
- :mod:`.base` -- :class:`AdaptiveContrastiveLoss`, their base (one pass or gradient caching,
  the loss's own trainable state);
- :mod:`.callbacks` -- :class:`LossStateCallback` (the loss state in every checkpoint, restored
  from the one the trainer resumes from); :mod:`.checkpoints` -- whether a trainer checkpoint
  can be resumed whole, :func:`last_complete_checkpoint`; :class:`LossStateCallback` also gives
  a scheduled temperature the trainer's step;
- :mod:`.simcse` -- SimCSE's model and poolers, :func:`make_loss` by name, its data, the
  trainer that logs the adaptive quantities and :func:`train_simcse` (:class:`SimCSEConfig`),
  one training run keeping the best STS-B dev checkpoint; :mod:`.simcse_names` -- its pooler and loss names
  (imports no framework);
- :mod:`.citations` -- the BibTeX entries shown in the model card.

The names below are imported from their module on first use (``pip install 'adaptcl[text]'``).

Trainable parts of a loss (AMCL's heads and temperature network, SimCSE's training-only MLP)
are optimised by ``SentenceTransformerTrainer`` (it optimises loss parameters) but are not part
of the saved model: save them with :meth:`AdaptiveContrastiveLoss.save_loss_state` (or the
:class:`LossStateCallback`, which does it at every checkpoint and restores them when the trainer
resumes from one) and restore them with :meth:`~AdaptiveContrastiveLoss.load_loss_state`. A
resumed training step whose model was restored but not the loss raises, naming the callback.

Large batches: ``tile_size=`` (an int) streams the similarity matrix in tiles with an exact
backward (Inf-CL, Cheng et al. 2024; :mod:`adaptcl.plugins.tiles._loop`), so the loss itself
needs memory linear in the batch (the default ``"auto"`` does so only where the materialised
logits would exceed the memory budget, :mod:`adaptcl.plugins.execution`); ``mini_batch_size=`` adds gradient caching
(GradCache, Gao et al. 2021) through sentence-transformers' own machinery (``CachedLossMixin``, as
``CachedMultipleNegativesRankingLoss``): the texts are embedded in mini-batches without a graph,
the loss and its gradient wrt the embeddings are computed on the full batch, and each mini-batch
is embedded again with gradient in backward (replaying its random state, so dropout masks are
identical). ``MatryoshkaLoss`` decorates such a loss's ``calculate_loss`` and DDP synchronises
once after the replay, exactly as with the peer; under ``AdaptiveLayerLoss``, which patches the
model's forward only during its forward pass, the loss embeds in one pass (the peer raises
there). Together they train with batches whose activations and similarity matrix would not fit.

Where sentence-transformers defines a behaviour (positional arguments, a batch of one pair,
``symmetric=True``) the losses follow it; :mod:`.losses` says how.

Example:
    >>> from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    >>> from adaptcl.adapters.sentence_transformers import MACLLoss
    >>> model = SentenceTransformer("all-MiniLM-L6-v2")
    >>> loss = MACLLoss(model, temperature=0.05, alpha=2.0, a0=0.8)   # MACL's SimCSE setting
    >>> trainer = SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss)
    >>> big = MACLLoss(model, mini_batch_size=64, tile_size=4096)   # batch 65,536 of texts
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adaptcl.adapters import lazy_exports
from adaptcl.adapters.sentence_transformers.simcse_names import LOSSES, POOLERS

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time __getattr__ imports them
    from adaptcl.adapters.sentence_transformers.base import (
        LOSS_STATE_FILE,
        AdaptiveContrastiveLoss,
        LossStateMismatchError,
        embedding_dimension,
        loss_state_digest,
    )
    from adaptcl.adapters.sentence_transformers.callbacks import LossStateCallback
    from adaptcl.adapters.sentence_transformers.checkpoints import (
        IncompleteCheckpointError,
        last_complete_checkpoint,
        verify_checkpoint,
    )
    from adaptcl.adapters.sentence_transformers.citations import (
        AMCL_CITATION,
        ASCL_CITATION,
        CLIP_CITATION,
        DYSTRESS_CITATION,
        INFONCE_CITATION,
        MACL_CITATION,
        SUPCON_CITATION,
        TEMPERATURE_SCHEDULE_CITATION,
    )
    from adaptcl.adapters.sentence_transformers.losses import (
        AMCLLoss,
        ASCLLoss,
        DySTreSSLoss,
        InfoNCELoss,
        MACLLoss,
    )
    from adaptcl.adapters.sentence_transformers.simcse import (
        AdaptiveSentenceTransformerTrainer,
        SimCSEConfig,
        SimCSEProjection,
        build_simcse_model,
        make_loss,
        stsb_dev_evaluator,
        supervised_dataset,
        train_simcse,
        training_projection,
        unsupervised_dataset,
        validate_text_dataset,
    )
    from adaptcl.adapters.sentence_transformers.temperatures import (
        LearnableTemperatureLoss,
        TemperatureScheduleLoss,
    )

_EXPORTS = {
    **dict.fromkeys(("InfoNCELoss", "MACLLoss", "ASCLLoss", "AMCLLoss", "DySTreSSLoss"), "losses"),
    **dict.fromkeys(("AdaptiveContrastiveLoss", "LOSS_STATE_FILE", "LossStateMismatchError",
                     "embedding_dimension", "loss_state_digest"), "base"),
    "LossStateCallback": "callbacks",
    **dict.fromkeys(("IncompleteCheckpointError", "last_complete_checkpoint", "verify_checkpoint"),
                    "checkpoints"),
    **dict.fromkeys(("TemperatureScheduleLoss", "LearnableTemperatureLoss"), "temperatures"),
    **dict.fromkeys(("MACL_CITATION", "ASCL_CITATION", "AMCL_CITATION", "INFONCE_CITATION",
                     "DYSTRESS_CITATION", "SUPCON_CITATION", "TEMPERATURE_SCHEDULE_CITATION",
                     "CLIP_CITATION"), "citations"),
    **dict.fromkeys(("AdaptiveSentenceTransformerTrainer", "SimCSEConfig", "SimCSEProjection",
                     "build_simcse_model", "make_loss", "stsb_dev_evaluator", "supervised_dataset",
                     "train_simcse", "training_projection", "unsupervised_dataset",
                     "validate_text_dataset"), "simcse"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "LOSSES", "POOLERS", "InfoNCELoss", "MACLLoss", "ASCLLoss", "AMCLLoss", "DySTreSSLoss",
    "TemperatureScheduleLoss", "LearnableTemperatureLoss", "AdaptiveContrastiveLoss",
    "LOSS_STATE_FILE", "LossStateMismatchError", "embedding_dimension", "loss_state_digest",
    "LossStateCallback", "IncompleteCheckpointError", "last_complete_checkpoint",
    "verify_checkpoint", "MACL_CITATION", "ASCL_CITATION", "AMCL_CITATION", "INFONCE_CITATION",
    "DYSTRESS_CITATION", "SUPCON_CITATION", "TEMPERATURE_SCHEDULE_CITATION", "CLIP_CITATION",
    "AdaptiveSentenceTransformerTrainer", "SimCSEConfig", "SimCSEProjection",
    "build_simcse_model", "make_loss", "stsb_dev_evaluator", "supervised_dataset",
    "train_simcse", "training_projection", "unsupervised_dataset", "validate_text_dataset",
]

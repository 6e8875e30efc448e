"""The check every evaluation protocol applies to embeddings before it scores them.

A protocol that scored NaN/inf or constant embeddings would report a number that is not a
result (a NaN correlation, a chance-level probe of a collapsed encoder). :func:`check_embeddings`
refuses them: non-finite values raise :class:`~adaptcl.plugins.validation.NonFiniteError` (a
``ValueError``; a recipe treats it as a diverged run), everything else a plain ``ValueError``.
"""

from __future__ import annotations

from typing import Any


def check_embeddings(x: Any, where: str, *, allow_constant: bool = False) -> None:
    """Refuse non-finite or constant embeddings (``[n, d]`` tensor or array) before they are used.

    ``where`` names the embeddings in the message. ``allow_constant`` accepts identical rows
    (a classifier's scores may be). Raises :class:`~adaptcl.plugins.validation.NonFiniteError`
    for NaN/inf and ``ValueError`` for no embeddings or one vector repeated.

    >>> import numpy as np
    >>> check_embeddings(np.eye(3), "toy")
    >>> check_embeddings(np.ones((3, 2)), "toy")
    Traceback (most recent call last):
    ...
    ValueError: toy: every embedding is the same vector (a collapsed or constant encoder)
    """
    import numpy as np

    from adaptcl.plugins.validation import NonFiniteError  # imports torch: only when checking

    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        raise ValueError(f"{where}: no embeddings")
    if not np.isfinite(x).all():
        count = int((~np.isfinite(x)).any(axis=-1).sum()) if x.ndim > 1 else int(
            (~np.isfinite(x)).sum())
        raise NonFiniteError(f"{where}: {count} embeddings contain NaN or inf")
    if (not allow_constant and x.ndim > 1 and x.shape[0] > 1
            and float(np.ptp(x, axis=0).max()) == 0.0):
        raise ValueError(f"{where}: every embedding is the same vector (a collapsed or "
                         "constant encoder)")

"""Argument checks shared by every loss and by the adapters: clear errors that name the offending
argument."""

from __future__ import annotations

import collections
import math
import warnings
from typing import Any, Literal

import torch
from torch import Tensor


class NonFiniteError(ValueError):
    """A tensor or a loss that is NaN or inf: bad data, or training that diverged.

    ``step`` and ``loss`` say where a training loop saw it (the optimisation step, counted
    from 1, and that step's loss), when the loop knows; a plain check leaves them ``None``.
    A ``ValueError``, so code that caught the checks' ``ValueError`` still does.
    """

    def __init__(self, message: str, *, step: int | None = None, loss: float | None = None):
        super().__init__(message)
        self.step, self.loss = step, loss


def check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def check_non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def check_finite_number(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def check_temperature_range(min_temperature: float,
                            max_temperature: float) -> tuple[float, float]:
    """``(min_temperature, max_temperature)`` as floats: both > 0 and ordered."""
    low = check_positive("min_temperature", min_temperature)
    high = check_positive("max_temperature", max_temperature)
    if high < low:
        raise ValueError(f"max_temperature must be >= min_temperature, got {high} < {low}")
    return low, high


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_int(name: str, value: int, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_bool(name: str, value: bool) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


#: what a loss's ``tile_size`` may be: ``None`` (materialise the logits), ``"auto"`` (the
#: dispatcher's choice, :mod:`~adaptcl.plugins.execution`) or an int >= 1 (tile at that size)
TileSize = int | Literal["auto"] | None


def check_tile_size(value: TileSize) -> TileSize:
    """``None``, ``"auto"`` or an int >= 1 (a bool is refused): a loss's ``tile_size``."""
    return _int_or("tile_size", value, (None, "auto"), "an int >= 1, 'auto' or None")


def check_max_logits_bytes(value: int | None) -> int | None:
    """``None`` or an int >= 1: the bytes the materialised logits may take
    (:mod:`~adaptcl.plugins.tiles._budget`)."""
    return _int_or("max_logits_bytes", value, (None,), "an int >= 1 (bytes) or None")


def _int_or(name: str, value: Any, others: tuple, expected: str) -> Any:
    """``value`` when it is one of ``others`` or an int >= 1 (not a bool); else one line naming
    ``name``: a ``ValueError`` for a wrong value (a string where ``others`` hold strings, an int
    below 1), a ``TypeError`` for a wrong type."""
    if value is None and None in others or isinstance(value, str) and value in others:
        return value
    wrong_string = isinstance(value, str) and any(isinstance(o, str) for o in others)
    if (isinstance(value, bool) or not isinstance(value, int)) and not wrong_string:
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    if wrong_string or value < 1:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_shared(*, gather_distributed: bool, gather_fn, check_finite: bool,
                 tile_size: TileSize) -> tuple[bool, object, bool, TileSize]:
    """The keywords every loss shares, checked the same way for all of them.

    Returns ``(gather_distributed, gather_fn, check_finite, tile_size)``.
    """
    check_bool("gather_distributed", gather_distributed)
    if gather_distributed and not torch.distributed.is_available():
        raise ValueError("gather_distributed=True but torch.distributed is not available")
    if gather_fn is not None and not callable(gather_fn):
        raise TypeError(f"gather_fn must be callable or None, got {type(gather_fn).__name__}")
    check_bool("check_finite", check_finite)
    return gather_distributed, gather_fn, check_finite, check_tile_size(tile_size)


def check_embedding_tensor(name: str, x: Tensor, *, dim: int | None = None, check_finite: bool = True) -> None:
    """Validate a ``[N, D]`` floating-point embedding tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape [batch, dim], got {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} has an empty feature dimension: {tuple(x.shape)}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} has feature dimension {x.shape[1]}, expected {dim}")
    if check_finite:
        check_all_finite(name, x)


def check_all_finite(name: str, x: Tensor) -> None:
    """Refuse NaN/inf on the CPU; on an accelerator, let them through and say so, never
    stalling it.

    One reduction over ``x``, negligible next to the N x N similarity matrix.

    * **CPU**: its result is read at once (nothing to wait for): :class:`NonFiniteError` (a
      ``ValueError``) naming the tensor. Under ``torch.compile`` (where a host read would break
      the graph) the traced ``torch._assert_async`` raises a ``RuntimeError`` instead.
    * **Accelerator** (CUDA and the others): nothing is raised and nothing waits. Reading the
      result would synchronise host and device on every step, and a device-side assertion
      ends the process's CUDA context. The values go on into the loss, which comes out NaN,
      as open_clip's ``ClipLoss``, Lightly's losses and sentence-transformers' MNRL do: under
      AMP, ``torch.amp.GradScaler`` skips that step (its gradients are not finite). The user
      is told by a :class:`NonFiniteWarning` once the device has got there: the result is
      copied to pinned host memory behind an event, and a later check looks whether the event
      is done (``query``, never ``synchronize``); the warning comes at the first check after
      that, usually the next step's. Under ``torch.compile`` there is no host side to tell
      from: the NaN loss is the only sign. Not during CUDA graph capture.
    * **meta**: there are no values to check.
    """
    if x.device.type == "meta":
        return
    if _on_host(x):
        finite = torch.isfinite(x).all()
        # Under torch.compile a host read is a graph break; the traced assertion is not.
        if torch.compiler.is_compiling():
            torch._assert_async(finite, f"{name} contains NaN or inf")
        elif not bool(finite):
            raise NonFiniteError(f"{name} contains NaN or inf")
    elif not torch.compiler.is_compiling():
        _NON_FINITE.note(name, torch.isfinite(x).all())


class NonFiniteWarning(RuntimeWarning):
    """NaN or inf that a loss met on an accelerator (``check_finite=True``): that step's loss is
    NaN, which ``torch.amp.GradScaler`` skips (:func:`check_all_finite`)."""


def _on_host(x: Tensor) -> bool:
    """Whether ``x``'s values are read at once (the CPU), not behind an accelerator's queue."""
    return x.device.type == "cpu"


class _Unreported:
    """The accelerator's finiteness checks whose results the host has not looked at yet, oldest
    first: each a flag copied to pinned host memory and the event after the copy. Looked at
    without waiting (``Event.query``), at every new check."""

    def __init__(self) -> None:
        self._pending: collections.deque[tuple[str, Tensor, Any]] = collections.deque()

    def note(self, name: str, finite: Tensor) -> None:
        self.tell()
        bad = finite.logical_not()
        if bad.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return  # a graph being captured may neither copy to the host nor be queried
        if bad.device.type == "cpu":  # (a stand-in for an accelerator in the tests)
            self._pending.append((name, bad, None))
            return
        flag = torch.empty((), dtype=torch.bool, pin_memory=True)
        flag.copy_(bad, non_blocking=True)
        done = torch.Event(device=bad.device)
        done.record()
        self._pending.append((name, flag, done))

    def tell(self) -> None:
        """Warn of each result the device has got to that found NaN or inf, oldest first."""
        while self._pending and (self._pending[0][2] is None or self._pending[0][2].query()):
            name, flag, _ = self._pending.popleft()
            if bool(flag):
                # one location (this line): Python's default filter shows it once per name
                warnings.warn(NonFiniteWarning(
                    f"{name} contained NaN or inf: the loss of that step is NaN (under AMP, "
                    "GradScaler skips the step); check_finite=False silences this"),
                    stacklevel=1)


_NON_FINITE = _Unreported()


def check_labels(name: str, labels: Tensor, length: int | None, device: torch.device, *,
                 minimum: int = 0) -> Tensor:
    """Validate ``[length]`` integer class labels (or pair indices) with values ``>= minimum``;
    returns them as ``int64``. ``length=None`` checks everything but the length.

    A bool or floating-point tensor is a ``TypeError`` (a float label column is a score, not a
    class); the range check is a ``ValueError`` on the CPU and, on an accelerator, a device-side
    assertion that never stalls the step, as torch's own checks of class indices
    (``F.cross_entropy``'s targets): a label out of range is a mistake in the data, not a step
    for a ``GradScaler`` to skip (unlike NaN or inf, :func:`check_all_finite`).
    """
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer labels, got {type(labels).__name__}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"{name} must be an integer tensor (class indices), got dtype {labels.dtype}")
    if labels.ndim != 1 or length is not None and labels.shape[0] != length:
        raise ValueError(f"{name} must have shape [{length or 'rows'}] (one per row), got "
                         f"{tuple(labels.shape)}")
    if labels.device != device:
        raise ValueError(f"{name} is on {labels.device} but the embeddings are on {device}")
    if labels.numel() and labels.device.type != "meta":
        low = (labels >= minimum).all()
        if labels.device.type == "cpu" and not torch.compiler.is_compiling():
            if not bool(low):
                raise ValueError(f"{name} must be >= {minimum}, got {int(labels.min())}")
        else:
            torch._assert_async(low, f"{name} must be >= {minimum}")
    return labels.long()


def check_pair(z0: Tensor, z1: Tensor, *, check_finite: bool = True) -> None:
    check_embedding_tensor("z0", z0, check_finite=check_finite)
    check_embedding_tensor("z1", z1, check_finite=check_finite)
    if z0.shape != z1.shape:
        raise ValueError(f"z0 and z1 must have the same shape, got {tuple(z0.shape)} and {tuple(z1.shape)}")
    if z0.device != z1.device:
        raise ValueError(f"z0 and z1 are on different devices: {z0.device} and {z1.device}")

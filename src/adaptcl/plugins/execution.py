"""Every execution choice of the losses in one home: the scoped setting :class:`tiling`.

A loss says *what* it computes (its method, form and temperatures) and how large a tile
(``tile_size``: ``None``, an int or ``"auto"``, :mod:`~adaptcl.plugins.base`). Every other
choice of *how* it runs is a field of one setting, :class:`TilingSetting`, as
``torch.nn.attention.sdpa_kernel`` is for attention:

* ``backend``: what computes a tiled call, ``"auto"`` (default), ``"torch"`` (the PyTorch tile
  loop, the reference) or ``"triton"`` (the fused kernels; every call on them, or a one-line
  ``ValueError`` naming why not);
* ``max_logits_bytes``: the memory budget of ``tile_size="auto"`` (``None``: half the free memory
  on CUDA, none elsewhere);
* ``backward``: the kernels' backward, ``"split"`` (default; deterministic) or ``"onepass"``
  (one product per tile fewer, float32 atomics, not deterministic);
* ``autotune``: time a few block configurations once per launch key and keep the fastest
  (synchronises with the host while it does); off by default;
* ``emulate_tensor_cores``: on the CPU, float32 products follow
  :func:`torch.get_float32_matmul_precision` as CUDA's tensor cores compute them (emulated
  exactly); off by default, so the CPU computes as PyTorch's own CPU matmul does: IEEE float32
  whatever that setting says;
* ``debug``: say every loss call's plan (which path, tile and precision, and why each backend
  that did not run did not) as a :class:`TilingDebugWarning`, as ``sdpa_kernel``'s debug
  reasons do; off by default.

How it is set:

* ``with tiling(field=value, ...):`` changes the fields it names when the block is entered and
  restores them when it is left, on an exception too; the fields it does not name keep what
  they were (an outer block's budget stays). Building ``tiling(...)`` checks its arguments (a
  one-line ``ValueError`` / ``TypeError`` naming the bad one) and changes nothing. Blocks nest,
  and ``tiling(...)`` decorates a function too.
* :func:`set_tiling` sets the process-wide default of the fields it names (as
  ``torch.backends.cuda.enable_flash_sdp``), :func:`current_tiling` reads the setting in effect.
* Two environment variables set a field's default when ``adaptcl.plugins`` is imported, as
  PyTorch's own do (:data:`ENVIRONMENT`): ``ADAPTCL_TRITON_BACKWARD`` (``split`` or
  ``onepass``) and ``ADAPTCL_TRITON_AUTOTUNE`` (``1``/``true``/``on``/``yes`` or
  ``0``/``false``/``off``/``no``); a value outside those is refused at import, in one line
  naming the variable.

The setting is **process-wide, not thread-local**, as ``sdpa_kernel``'s backends are process
flags: a block entered in one thread is seen by every thread until it is left (a
``DataParallel`` replica or a loader thread sees what the main thread set); blocks of different
settings should not be open in several threads at once. Under ``torch.compile`` the setting is
read while tracing and guarded: a compiled loss recompiles when it changes; set it outside the
compiled function. The kernels read ``backward`` and ``autotune`` when they launch: the backward
launches where ``loss.backward()`` runs, so keep that call inside the block (or set the field
process-wide).

What a call chose is recorded as a :class:`TilePlan`, ``loss.last_stats.plan``.

Example:
    >>> import torch
    >>> from adaptcl.plugins import InfoNCELoss, current_tiling, tiling
    >>> z0, z1 = torch.randn(64, 16), torch.randn(64, 16)
    >>> with tiling(max_logits_bytes=2**30):          # this block only
    ...     with tiling(backend="torch"):               # the budget above still holds here
    ...         current_tiling().max_logits_bytes
    1073741824
    >>> current_tiling().max_logits_bytes is None
    True
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from .validation import check_bool, check_choice, check_max_logits_bytes

#: the kernels' backward: FlashAttention-2's deterministic split, or the one-pass variant
Backward = Literal["split", "onepass"]
BACKWARDS: tuple[Backward, ...] = get_args(Backward)
#: the environment variable that sets ``backward``'s default
BACKWARD_ENV = "ADAPTCL_TRITON_BACKWARD"
#: the environment variable that sets ``autotune``'s default
AUTOTUNE_ENV = "ADAPTCL_TRITON_AUTOTUNE"
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


class TilingDebugWarning(UserWarning):
    """A loss call's plan, said on every call under ``tiling(debug=True)``."""


def _check_backend(value: Any) -> str:
    return check_choice("backend", value, ("auto", *_BACKENDS))


def _setting(default: Any, check: Callable[[Any], Any]) -> Any:
    """A field of :class:`TilingSetting`: its default and the check of a new value (a one-line
    error naming the field)."""
    return field(default=default, metadata={"check": check})


@dataclass(frozen=True)
class TilingSetting:
    """The fields of the scoped setting (module docstring); :func:`current_tiling` returns the
    one in effect. A new execution choice is one field here: its default and its check."""

    backend: str = _setting("auto", _check_backend)
    max_logits_bytes: int | None = _setting(None, check_max_logits_bytes)
    backward: Backward = _setting("split", lambda v: check_choice("backward", v, BACKWARDS))
    autotune: bool = _setting(False, lambda v: check_bool("autotune", v))
    emulate_tensor_cores: bool = _setting(False, lambda v: check_bool("emulate_tensor_cores", v))
    debug: bool = _setting(False, lambda v: check_bool("debug", v))

    def __post_init__(self) -> None:
        for f in fields(self):
            f.metadata["check"](getattr(self, f.name))


@dataclass(frozen=True)
class TilePlan:
    """How one loss call computed its ``[A, C]`` row statistics: the dispatcher's answer,
    ``loss.last_stats.plan``.

    Example: ``TilePlan(path="torch", tile=64, precision="ieee")`` is the PyTorch loop in
    ``64 x 64`` tiles with IEEE products; ``str(plan)`` says it in one line with the reasons.
    """

    path: str
    """``"materialise"`` (the ``[A, C]`` logits, autograd's backward) or the backend that
    streamed them: ``"torch"`` (the PyTorch tile loop) or ``"triton"`` (the fused kernels)"""
    tile: int | None = None
    """the loop's tile (rows of a row block for the losses that chunk anchors); ``None`` when
    materialised or on a backend that runs its own blocks (the kernels)"""
    chosen: int | None = None
    """the tile the budget chose for ``tile_size="auto"`` (``last_stats["auto_tile_size"]``)"""
    precision: str = "ieee"
    """the precision of the products (``"ieee"``, ``"tf32"``, ``"bf16"``, ``"fp16"``)"""
    declined: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """``(backend, why not)`` for each backend that did not run this call"""

    @property
    def tiled(self) -> bool:
        return self.path != "materialise"

    def __str__(self) -> str:
        where = "materialised" if not self.tiled else (
            f"{self.path}, tile {self.tile}" if self.tile is not None else self.path)
        reasons = "".join(f"; not {name}: {why}" for name, why in self.declined)
        return f"{where}, {self.precision} products{reasons}"


#: the registered tile backends, by name, in the order ``backend="auto"`` considers them
_BACKENDS: dict[str, Any] = {}


def _register_backend(backend: Any) -> Any:
    """Make ``backend`` (the protocol of ``adaptcl.plugins.tiles._backend.Backend``: an object
    with a ``name``) a choice of ``tiling(backend=...)`` and of ``"auto"``, after those
    registered before it; returns it. The built-in backends are registered by
    ``adaptcl.plugins.tiles._dispatch``, imported with ``adaptcl.plugins``."""
    name = backend.name
    if name in ("auto", "materialise") or name in _BACKENDS:
        raise ValueError(f"a tile backend named {name!r} exists already")
    _BACKENDS[name] = backend
    return backend


def _unregister_backend(name: str) -> None:
    """Remove the backend ``name`` (a test's toy); a setting that named it falls back to
    ``"auto"``."""
    global _SETTING
    _BACKENDS.pop(name, None)
    if _SETTING.backend == name:
        _SETTING = replace(_SETTING, backend="auto")


def _backends() -> tuple[Any, ...]:
    """The registered backends, in ``"auto"``'s order."""
    return tuple(_BACKENDS.values())


def _backend_named(name: str) -> Any:
    return _BACKENDS[name]


def _parse_backward(raw: str) -> str:
    value = raw.strip().lower()
    if value not in BACKWARDS:
        raise ValueError(f"{BACKWARD_ENV} must be one of {', '.join(BACKWARDS)}, got {raw!r}")
    return value


def _parse_switch(variable: str) -> Callable[[str], bool]:
    def parse(raw: str) -> bool:
        value = raw.strip().lower()
        if value not in _TRUE + _FALSE:
            raise ValueError(f"{variable} must be one of {', '.join(_TRUE + _FALSE)}, got "
                             f"{raw!r}")
        return value in _TRUE
    return parse


#: field -> (environment variable, its parser): the variables that set a field's default when
#: ``adaptcl.plugins`` is imported
ENVIRONMENT: dict[str, tuple[str, Callable[[str], Any]]] = {
    "backward": (BACKWARD_ENV, _parse_backward),
    "autotune": (AUTOTUNE_ENV, _parse_switch(AUTOTUNE_ENV)),
}


def _defaults_from(environ: Mapping[str, str]) -> TilingSetting:
    """The process-wide default that ``environ`` sets (:data:`ENVIRONMENT`; an empty or absent
    variable keeps the field's default); a ``ValueError`` naming a variable whose value it does
    not know."""
    return TilingSetting(**{name: parse(environ[variable])
                            for name, (variable, parse) in ENVIRONMENT.items()
                            if environ.get(variable, "").strip()})


_SETTING = _defaults_from(os.environ)
_LOCK = threading.Lock()
_FIELDS = tuple(f.name for f in fields(TilingSetting))


def _checked(caller: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (field -> new value), each checked: one line naming a bad one, or a field
    that does not exist."""
    for name in values:
        if name not in _FIELDS:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r} (the "
                            f"fields: {', '.join(_FIELDS)})")
    replace(_SETTING, **values)  # each value checked, nothing set
    return values


def current_tiling() -> TilingSetting:
    """The setting in effect: the process-wide default with the open blocks' fields."""
    return _SETTING


def set_tiling(**fields: Any) -> None:
    """Set the process-wide default of the fields named (those of :class:`TilingSetting`); the
    others keep theirs. A bad value is refused in one line naming it, and nothing is set.

    Example:
        >>> set_tiling(backend="torch")                     # the PyTorch loop from now on
        >>> current_tiling().backend
        'torch'
        >>> set_tiling(backend="auto")
    """
    global _SETTING
    changes = _checked("set_tiling", fields)
    with _LOCK:
        _SETTING = replace(_SETTING, **changes)


class tiling(contextlib.ContextDecorator):  # noqa: N801 - a context manager, as sdpa_kernel
    """A block (or a decorated function) in which the fields named (those of
    :class:`TilingSetting`) take these values: set on entering, restored to what they were on
    leaving, on an exception too; the other fields are untouched (module docstring). Building
    it checks the arguments, one line naming a bad one, and changes nothing. ``as`` gives the
    setting in effect inside the block.

    Examples:
        >>> with tiling(max_logits_bytes=2**30) as setting:   # restored on exit
        ...     setting.max_logits_bytes
        1073741824
        >>> @tiling(backend="torch")
        ... def step():
        ...     return current_tiling().backend
        >>> step()
        'torch'
    """

    def __init__(self, **fields: Any) -> None:
        self.changes = _checked("tiling", fields)
        self._saved: list[dict[str, Any]] = []  # one per open entry (a decorated recursion)

    def __enter__(self) -> TilingSetting:
        global _SETTING
        with _LOCK:
            self._saved.append({name: getattr(_SETTING, name) for name in self.changes})
            _SETTING = replace(_SETTING, **self.changes)
            return _SETTING

    def __exit__(self, *exc: object) -> None:
        global _SETTING
        with _LOCK:
            _SETTING = replace(_SETTING, **self._saved.pop())

    def __repr__(self) -> str:
        named = ", ".join(f"{name}={value!r}" for name, value in self.changes.items())
        return f"tiling({named})"


__all__ = ["TilingSetting", "tiling", "set_tiling", "current_tiling", "TilePlan",
           "TilingDebugWarning", "Backward", "BACKWARDS", "BACKWARD_ENV", "AUTOTUNE_ENV",
           "ENVIRONMENT"]

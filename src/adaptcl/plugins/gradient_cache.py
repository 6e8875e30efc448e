"""Gradient caching: a training step exact for the whole batch at the activation memory of one
chunk (Gao et al. 2021).

Tiling (:mod:`~adaptcl.plugins.tiles`) makes the *loss* linear in memory; a training step still
holds every encoder activation of the batch. :func:`cached_forward` removes that bound in the
three passes of Gao et al.:

1. the encoder embeds the batch ``mini_batch_size`` rows at a time without a graph, and the
   embeddings it returns are the whole batch's;
2. the loss is computed on them as usual, and its backward brings the gradient of the loss with
   respect to every embedding (of the loss's own parameters too: AMCL's heads, a learnable
   temperature, a memory bank's update all happen here, once);
3. when that gradient reaches the embeddings, each chunk is run again with a graph and its slice
   of the gradient is back-propagated into the encoder's parameters.

The embeddings are an ordinary autograd node (as :func:`torch.utils.checkpoint.checkpoint`'s
output is): ``loss.backward()``, ``scaler.scale(loss).backward()``, Lightning's automatic
optimisation, gradient accumulation and clipping drive pass 3 unchanged, and its gradients carry
whatever scale the backward carries. The parameters' gradients are returned through the node
(summed over the chunks), so each parameter receives one gradient per call, as DDP's reducer
expects; no ``retain_graph`` is needed.

Exactness:

- **Random state.** The CPU and CUDA generators are captured before each chunk of pass 1 and
  replayed for that chunk in pass 3 (as sentence-transformers' ``RandContext``), so dropout and
  stochastic depth draw the same masks; the generators leave pass 3 as they entered it.
- **Autocast.** Pass 3 runs under the autocast state pass 1 ran under (backward runs outside
  the user's ``torch.autocast``), as reentrant checkpointing does.
- **BatchNorm**, ``batch_norm=``:

  - ``"chunk"`` (default): in training mode every chunk is normalised with its own statistics:
    the step equals an uncached step that runs the encoder over the same chunks one after
    another, not one over the whole batch (as DDP without ``SyncBatchNorm`` normalises with
    each GPU's batch). The running statistics take one momentum update per chunk, with that
    chunk's statistics, by pass 1 (``batch / mini_batch_size`` updates per call where an
    uncached forward takes one); pass 3 puts back what pass 1 left, so none is taken twice. By
    how much the step differs from the whole-batch one is measured in docs/large_batches.md
    (``benchmarks/bench_batchnorm_chunks.py``). ``SyncBatchNorm`` under DDP normalises with one
    chunk of every rank.
  - ``"frozen"``: every BatchNorm layer runs in eval mode in both passes (its running
    statistics normalise, nothing updates them), as open_clip's ``freeze_bn_stats`` and
    timm's ``freeze_batch_norm_2d`` do for a pre-trained encoder. The step then equals an
    uncached step with the same frozen layers over the whole batch. Not for training an encoder
    from scratch, whose running statistics mean nothing yet.

  An encoder without BatchNorm (LayerNorm towers, GroupNorm) has no per-chunk quantity:
  ``batch_norm`` changes nothing and the step is the uncached one.

Under DDP, call :func:`cached_forward` inside the forward of the module DDP wraps (Lightning's
``training_step`` runs inside it), so the reducer expects the backward; gathered columns with
gradients (``gather_distributed=True``) bring each rank the gradient of its own rows, which is
what its pass 3 replays.

Reference: Gao, Zhang, Han & Callan, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup", RepL4NLP 2021, arXiv:2101.06983; sentence-transformers'
``CachedMultipleNegativesRankingLoss`` and open_clip_train's ``--accum-freq`` do the same for
their own models.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from adaptcl.plugins import InfoNCELoss, cached_forward
    >>> encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    >>> x0, x1 = torch.randn(256, 32), torch.randn(256, 32)   # two views of 256 samples
    >>> z0 = cached_forward(encoder, x0, 64)                  # [256, 16], 64 rows at a time
    >>> z1 = cached_forward(encoder, x1, 64)
    >>> InfoNCELoss(0.1)(z0, z1).backward()                   # pass 3 runs here
    >>> encoder[0].weight.grad.shape
    torch.Size([64, 32])
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

# torch's pytree: how torch.func, torch.export and transformers (which registers every
# ModelOutput there) take nested outputs apart and put them back together
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten
from torch.utils.checkpoint import get_device_states, set_device_states

from .validation import check_choice, check_int

__all__ = ["BATCH_NORM_MODES", "BatchNormMode", "cached_forward"]

#: what BatchNorm computes in a cached step (see the module's docstring)
BatchNormMode = Literal["chunk", "frozen"]
BATCH_NORM_MODES: tuple[BatchNormMode, ...] = get_args(BatchNormMode)

#: ``progress(iterable, desc=...)``: wraps the chunks of a pass (``tqdm`` fits)
Progress = Callable[..., Iterable]


def cached_forward(encoder: Callable[..., Any], inputs: Tensor | Sequence[Tensor],
                   mini_batch_size: int, *, module: nn.Module | None = None,
                   out_dims: int = 0, batch_norm: BatchNormMode = "chunk",
                   progress: Progress | None = None) -> Any:
    """``encoder(*inputs)`` for the whole batch, computed ``mini_batch_size`` rows at a time,
    whose backward re-runs each chunk with a graph (Gao et al.'s gradient caching).

    Args:
        encoder: maps a chunk of ``inputs`` (rows along dim 0) to its outputs, each with a row
            per input row: a tensor, or tensors nested in tuples, lists and dicts (a
            sentence-transformers model's features, a Hugging Face ``ModelOutput``; ``None``
            entries stay ``None``): an ``nn.Module``, a method of one
            (``model.encode_image``) or any function of the chunk given with ``module``. Every
            tensor it returns is kept for the whole batch: return what the loss uses.
        inputs: a tensor, or a tuple or list of tensors with the same number of rows, each a
            positional argument (each chunk is ``encoder(*chunk)``): per-sample tensors are
            one tensor, ``torch.stack``-ed; a dict is refused (``model(**batch)`` or
            ``model(batch)``: wrap the encoder in a function of its tensors).
        mini_batch_size: rows per chunk (the last one may be shorter); at least 1.
        module: the ``nn.Module`` whose parameters and BatchNorm layers ``encoder`` uses
            (default: ``encoder`` itself, or the module of a bound method). Parameters outside
            it that the encoder uses are refused with a ``ValueError`` at the backward, not
            silently left without their gradient.
        out_dims: the dimension of every output that holds the rows (as ``torch.vmap``'s
            ``out_dims``): 1 for AMCL's multi-head projections, ``[heads, rows, dim]``.
        batch_norm: ``"chunk"`` (statistics per chunk, one momentum update of the running
            statistics per chunk) or ``"frozen"`` (BatchNorm in eval mode in both passes); see
            the module's docstring.
        progress: wraps each pass's chunks, ``progress(chunks, desc=...)``; e.g.
            ``functools.partial(tqdm.tqdm, leave=False)``. ``None``: quiet.

    Returns:
        What ``encoder`` returns for the whole batch, in the structure it returns (a tensor, a
        tuple, a dict, a ``ModelOutput``...), every tensor concatenated along ``out_dims``.
        Without grad mode, or where nothing it depends on requires a gradient, the chunks are
        simply embedded and concatenated (one pass).
    """
    mini_batch_size = check_int("mini_batch_size", mini_batch_size, 1)
    check_choice("batch_norm", batch_norm, BATCH_NORM_MODES)
    out_dims = check_int("out_dims", out_dims, 0)
    tensors = _input_tensors(inputs)
    owner = _owner(encoder, module)
    _check_arguments(encoder, len(tensors))
    params = [p for p in owner.parameters() if p.requires_grad]
    run = _CachedRun(encoder, tensors, mini_batch_size, owner, out_dims, batch_norm, progress)
    needs_graph = torch.is_grad_enabled() and (
        bool(params) or any(t.requires_grad for t in tensors))
    if not needs_graph:
        return run.restructure(run.embed(replayable=False))
    run.params = params
    return run.restructure(_CachedForward.apply(run, *tensors, *params))


def _input_tensors(inputs: Any) -> tuple[Tensor, ...]:
    """``inputs`` as the positional arguments of ``encoder``, refused in one line naming what
    was expected where it is no tensor or sequence of tensors with one number of rows."""
    if isinstance(inputs, Tensor):
        tensors: tuple[Any, ...] = (inputs,)
    elif isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a tensor or a tuple of tensors, each a positional "
                        f"argument of encoder, got a {type(inputs).__name__}: pass its tensors "
                        "and an encoder taking them, e.g. (batch['input_ids'], "
                        "batch['attention_mask']) with lambda ids, mask: model(input_ids=ids, "
                        "attention_mask=mask) and module=model")
    elif isinstance(inputs, (tuple, list)):
        tensors = tuple(inputs)
    else:
        raise TypeError("inputs must be a tensor or a tuple of tensors, got "
                        f"{type(inputs).__name__}")
    if not tensors:
        raise TypeError("inputs must be a tensor or a non-empty tuple of tensors, got an empty "
                        f"{type(inputs).__name__}")
    wrong = [(i, type(t).__name__) for i, t in enumerate(tensors) if not isinstance(t, Tensor)]
    if wrong:
        raise TypeError(f"inputs must be a tensor or a tuple of tensors, got a "
                        f"{type(inputs).__name__} holding {wrong[0][1]} at index {wrong[0][0]}")
    rows = {t.shape[0] if t.dim() else None for t in tensors}
    if len(rows) != 1 or None in rows or 0 in rows:
        raise ValueError("inputs must have the same number of rows (>= 1) along dim 0, got "
                         f"shapes {[tuple(t.shape) for t in tensors][:4]}")
    return tensors


def _check_arguments(encoder: Callable[..., Any], count: int) -> None:
    """Refuse ``inputs`` whose tensors ``encoder`` cannot take as its positional arguments
    (a list of per-sample tensors is as many arguments), before any chunk is embedded."""
    function = encoder.forward if isinstance(encoder, nn.Module) else encoder
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: its call will say
        return
    try:
        signature.bind(*range(count))
    except TypeError as err:
        raise TypeError(f"inputs gives encoder {count} positional argument(s), one per tensor, "
                        f"which encoder{signature} does not take ({err}); per-sample tensors "
                        "are one tensor: torch.stack them") from None


def _owner(encoder: Callable[..., Any], module: nn.Module | None) -> nn.Module:
    if module is not None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        return module
    if isinstance(encoder, nn.Module):
        return encoder
    owner = getattr(encoder, "__self__", None)
    if isinstance(owner, nn.Module):
        return owner
    if not callable(encoder):
        raise TypeError(f"encoder must be callable, got {type(encoder).__name__}")
    raise TypeError("encoder is neither an nn.Module nor a method of one: pass module=, the "
                    "nn.Module whose parameters it uses")


class _RandomState:
    """The CPU generator and those of the CUDA devices of ``tensors``, captured now and replayed
    by :meth:`replay` (which leaves the generators as it found them)."""

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.cpu = torch.get_rng_state()
        self.devices, self.states = get_device_states(*tensors)

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            set_device_states(self.devices, self.states)
            yield


def _autocast_state() -> list[tuple[str, dict[str, Any]]]:
    """``torch.autocast``'s arguments for every device type where it is available now."""
    state = []
    for device in ("cpu", "cuda"):
        if torch.amp.is_autocast_available(device):
            state.append((device, {"enabled": torch.is_autocast_enabled(device),
                                   "dtype": torch.get_autocast_dtype(device),
                                   "cache_enabled": torch.is_autocast_cache_enabled()}))
    return state


@contextlib.contextmanager
def _autocast(state: list[tuple[str, dict[str, Any]]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for device, kwargs in state:
            stack.enter_context(torch.autocast(device, **kwargs))
        yield


def _running_stats(module: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    """The norm layers of ``module`` that keep running statistics (BatchNorm, SyncBatchNorm,
    InstanceNorm with ``track_running_stats``)."""
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._NormBase)
            and m.track_running_stats and m.running_mean is not None]


@contextlib.contextmanager
def _statistics_kept(norms: list[nn.modules.batchnorm._NormBase]) -> Iterator[None]:
    """Whatever runs inside leaves the running statistics of ``norms`` as it found them."""
    saved = [{name: buffer.clone() for name, buffer in m.named_buffers(recurse=False)
              if buffer is not None} for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in zip(norms, saved, strict=True):
                for name, value in buffers.items():
                    getattr(m, name).copy_(value)


@contextlib.contextmanager
def _batch_norm_frozen(module: nn.Module) -> Iterator[None]:
    """Every BatchNorm layer of ``module`` in eval mode inside, its mode restored after."""
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    modes = [m.training for m in layers]
    for m in layers:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(layers, modes, strict=True):
            m.train(mode)


class _CachedRun:
    """One call of :func:`cached_forward`: the chunks, and what pass 3 needs to replay them."""

    def __init__(self, encoder: Callable[..., Any], inputs: tuple[Tensor, ...], size: int,
                 module: nn.Module, out_dims: int, batch_norm: BatchNormMode,
                 progress: Progress | None) -> None:
        self.encoder, self.inputs, self.module, self.dim = encoder, inputs, module, out_dims
        rows = inputs[0].shape[0]
        self.ranges = [(b, min(b + size, rows)) for b in range(0, rows, size)]
        self.batch_norm, self.progress = batch_norm, progress
        self.params: list[nn.Parameter] = []
        self.states: list[_RandomState] = []
        self.autocast: list[tuple[str, dict[str, Any]]] = []
        self.structure: TreeSpec | None = None  # what the encoder returned, taken apart
        self.tensors: list[bool] = []  # which of its leaves are tensors (the others: None)
        self.first = ""  # the first chunk's output, described for a message

    def _chunks(self, desc: str) -> Iterable[tuple[int, int]]:
        return self.ranges if self.progress is None else self.progress(self.ranges, desc=desc)

    def _mode(self) -> contextlib.AbstractContextManager:
        return (_batch_norm_frozen(self.module) if self.batch_norm == "frozen"
                else contextlib.nullcontext())

    def _call(self, chunk: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """``encoder(*chunk)``'s tensors, in the order of its structure's leaves."""
        rows = chunk[0].shape[0]
        out = self.encoder(*chunk)
        leaves, structure = tree_flatten(out)
        tensors = [leaf is not None for leaf in leaves]
        if self.structure is None:
            self.structure, self.tensors, self.first = structure, tensors, _describe(out)
        elif structure != self.structure or tensors != self.tensors:
            raise ValueError("encoder must return the same structure for every chunk: a chunk "
                             f"of {rows} rows gave {_describe(out)}, the first {self.first}")
        outputs = tuple(leaf for leaf in leaves if leaf is not None)
        if not outputs or not all(isinstance(o, Tensor) and o.dim() > self.dim
                                  and o.shape[self.dim] == rows for o in outputs):
            raise ValueError("encoder must return tensors (a tensor, or tensors in tuples, "
                             "lists, dicts or a ModelOutput) with a row per input row along dim "
                             f"out_dims={self.dim}: a chunk of {rows} rows gave {_describe(out)}")
        return outputs

    def embed(self, replayable: bool) -> tuple[Tensor, ...]:
        """Pass 1: every chunk, without a graph, into preallocated outputs; with
        ``replayable`` the random and autocast states pass 3 needs."""
        self.autocast = _autocast_state()
        rows, outputs = self.inputs[0].shape[0], None
        with torch.no_grad(), self._mode():
            for begin, end in self._chunks("gradient cache: embed"):
                if replayable:
                    self.states.append(_RandomState(self.inputs))
                chunk = self._call([t[begin:end] for t in self.inputs])
                if outputs is None:
                    outputs = [o.new_empty((*o.shape[:self.dim], rows, *o.shape[self.dim + 1:]))
                               for o in chunk]
                for whole, part in zip(outputs, chunk, strict=True):
                    whole.narrow(self.dim, begin, end - begin).copy_(part)
        return tuple(outputs)

    def replay(self, grads: Sequence[Tensor]) -> tuple[Tensor | None, ...]:
        """Pass 3: each chunk again with a graph, its slice of ``grads`` back-propagated; the
        gradients of the inputs and the parameters, summed over the chunks."""
        input_grads = [torch.zeros_like(t) if t.requires_grad else None for t in self.inputs]
        totals: list[Tensor | None] = [None] * len(self.params)
        # pass 1 updated the running statistics; pass 3 leaves them as pass 1 left them
        norms = _running_stats(self.module) if self.batch_norm == "chunk" else []
        with torch.enable_grad(), self._mode(), _statistics_kept(norms):
            for index, (begin, end) in enumerate(self._chunks("gradient cache: replay")):
                leaves = [t[begin:end].detach().requires_grad_() if t.requires_grad
                          else t[begin:end] for t in self.inputs]
                with self.states[index].replay(), _autocast(self.autocast):
                    outputs = self._call(leaves)
                live = [(o, g.narrow(self.dim, begin, end - begin).to(o.dtype))
                        for o, g in zip(outputs, grads, strict=True) if o.requires_grad]
                if not live:
                    continue
                if index == 0:
                    self._check_leaves([o for o, _ in live], leaves)
                chunk_leaves = [t for t in leaves if t.requires_grad]
                found = torch.autograd.grad([o for o, _ in live], [*chunk_leaves, *self.params],
                                            [g for _, g in live], allow_unused=True)
                parts = iter(found[:len(chunk_leaves)])
                for total in input_grads:
                    part = next(parts) if total is not None else None
                    if part is not None:
                        total[begin:end] = part
                for i, part in enumerate(found[len(chunk_leaves):]):
                    if part is not None:
                        totals[i] = _accumulate(totals[i], part)
        return (*input_grads, *(_as_param(t, p) for t, p in zip(totals, self.params,
                                                                 strict=True)))

    def _check_leaves(self, outputs: list[Tensor], leaves: list[Tensor]) -> None:
        """Refuse a graph that reaches a parameter ``module`` does not hold: its gradient would
        silently be lost (the node returns gradients only for ``module``'s parameters)."""
        known = {id(p) for p in self.params} | {id(t) for t in leaves}
        seen, stack, foreign = set(), [o.grad_fn for o in outputs], []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)
            if variable is not None and id(variable) not in known:
                foreign.append(tuple(variable.shape))
            stack.extend(next_node for next_node, _ in node.next_functions)
        if foreign:
            raise ValueError(f"the encoder uses {len(foreign)} tensor(s) requiring a gradient "
                             f"outside module (shapes {foreign[:3]}): pass module=, the "
                             "nn.Module holding every parameter the encoder uses")

    def restructure(self, outputs: Tensor | tuple[Tensor, ...]) -> Any:
        """The whole batch's tensors in the structure the encoder returns (its ``None``
        leaves put back)."""
        tensors = iter((outputs,) if isinstance(outputs, Tensor) else outputs)
        return tree_unflatten([next(tensors) if is_tensor else None
                               for is_tensor in self.tensors], self.structure)


def _describe(out: Any) -> str:
    """What an encoder returned, in a few words: its type and its leaves' shapes or types."""
    leaves, _ = tree_flatten(out)
    if len(leaves) == 1 and leaves[0] is out:
        return f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
    shown = [tuple(leaf.shape) if isinstance(leaf, Tensor) else type(leaf).__name__
             for leaf in leaves[:4]]
    return f"a {type(out).__name__} of {shown}{' ...' if len(leaves) > 4 else ''}"


def _accumulate(total: Tensor | None, part: Tensor) -> Tensor:
    """``total + part``, in float32 for half-precision parameters (64 chunks of bf16 sums lose
    what one backward over the batch, accumulating in float32, keeps)."""
    if part.dtype in (torch.float16, torch.bfloat16):
        part = part.float()
    return part if total is None else total.add_(part)


def _as_param(total: Tensor | None, param: Tensor) -> Tensor | None:
    return None if total is None else total.to(param.dtype)


class _CachedForward(torch.autograd.Function):
    """Pass 1 in ``forward``, pass 3 in ``backward``; the inputs and the parameters are its
    inputs, so the engine accumulates each parameter's gradient once (DDP's reducer fires once)."""

    @staticmethod
    def forward(ctx: Any, run: _CachedRun, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.run = run
        return run.embed(replayable=True)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        return (None, *ctx.run.replay(grads))

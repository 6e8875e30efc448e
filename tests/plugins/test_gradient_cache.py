"""Gradient caching (:func:`adaptcl.plugins.cached_forward`): a cached step's gradients equal the
uncached step's, for every kind of encoder and loss; BatchNorm, random state, autocast,
GradScaler, memory and the refusals."""

from __future__ import annotations

import copy
import functools
import weakref

import pytest
import torch
from torch import nn

from adaptcl.plugins import (
    AMCLLoss,
    InfoNCELoss,
    LearnableTemperatureLoss,
    MACLLoss,
    MultiHeadProjection,
    PairTemperature,
    cached_forward,
)

EXACT = {"rtol": 0.0, "atol": 1e-10}  # float64: the tolerance
N, D_IN, D_OUT = 24, 12, 6


def _mlp(batch_norm: bool = False, dropout: float = 0.0) -> nn.Module:
    """A SimCLR-style encoder: a backbone and a projection head (BatchNorm where asked)."""
    torch.manual_seed(0)
    norm = [nn.BatchNorm1d(32)] if batch_norm else []
    drop = [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(nn.Linear(D_IN, 32), *norm, nn.ReLU(), *drop, nn.Linear(32, 32),
                         nn.ReLU(), nn.Linear(32, D_OUT)).double()


def _views(n: int = N, dim: int = D_IN) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(n, dim, generator=g, dtype=torch.float64),
            torch.randn(n, dim, generator=g, dtype=torch.float64))


def _grads(*modules: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for m in modules for p in m.parameters() if p.requires_grad]


def _assert_same(got: list[torch.Tensor], want: list[torch.Tensor], **tol) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **(tol or EXACT))


def _chunkwise(encoder: nn.Module, x: torch.Tensor, size: int) -> torch.Tensor:
    """The uncached step over the same chunks: each chunk through the encoder with a graph."""
    return torch.cat([encoder(x[b:b + size]) for b in range(0, len(x), size)])


@pytest.mark.parametrize("size", [5, 8, N, 100])  # a remainder, a divisor, one chunk, > batch
def test_simclr_encoder_equals_full_batch(size):
    cached, plain = _mlp(), _mlp()
    loss_fn = InfoNCELoss(0.2)
    x0, x1 = _views()
    loss_fn(plain(x0), plain(x1)).backward()
    loss = loss_fn(cached_forward(cached, x0, size), cached_forward(cached, x1, size))
    loss.backward()
    _assert_same(_grads(cached), _grads(plain))


def test_losses_with_parameters_get_their_gradient_from_the_loss():
    """AMCL's heads (in the encoder) and its temperature network (in the loss), a learnable
    temperature and MACL: every parameter's gradient equals the uncached step's."""
    def amcl():
        torch.manual_seed(3)
        return (nn.Sequential(nn.Linear(D_IN, 16), nn.ReLU(),
                              MultiHeadProjection(16, 16, D_OUT, num_heads=3,
                                                  batch_norm=False)).double(),
                AMCLLoss(PairTemperature(D_OUT), 1e-2).double())

    def learnable():
        return _mlp(), LearnableTemperatureLoss(0.1).double()

    def macl():
        return _mlp(), MACLLoss(0.1, 0.5, 0.2)

    x0, x1 = _views()
    for make in (amcl, learnable, macl):
        (enc_a, loss_a), (enc_b, loss_b) = make(), make()
        loss_a(enc_a(x0), enc_a(x1)).backward()
        rows = 1 if make is amcl else 0  # the heads give [heads, rows, dim]
        loss_b(cached_forward(enc_b, x0, 7, out_dims=rows),
               cached_forward(enc_b, x1, 7, out_dims=rows)).backward()
        assert any(p.requires_grad for p in loss_a.parameters()) or make is macl
        _assert_same(_grads(enc_b, loss_b), _grads(enc_a, loss_a))


def test_moco_query_cached_key_momentum_and_queue():
    """MoCo: the query is cached, the momentum key encoder runs without a graph (chunked too),
    the queue enters as negatives and is updated once, after the loss."""
    query_a, query_b = _mlp(), _mlp()
    key = copy.deepcopy(query_a).requires_grad_(False)
    queue = torch.randn(40, D_OUT, dtype=torch.float64)
    loss_fn = InfoNCELoss(0.2, form="cross_view")
    x0, x1 = _views()
    with torch.no_grad():
        k = key(x1)
        k_cached = cached_forward(key, x1, 5)  # no graph: one pass, chunked
    torch.testing.assert_close(k_cached, k, **EXACT)
    assert not k_cached.requires_grad
    loss_fn(query_a(x0), k, negatives=queue).backward()
    loss_fn(cached_forward(query_b, x0, 5), k_cached, negatives=queue).backward()
    _assert_same(_grads(query_b), _grads(query_a))


def test_tuple_outputs_and_inputs_requiring_grad():
    """An encoder returning ``(z, p)`` (SimSiam's projection and prediction) and an input that
    requires a gradient (a cached stage after an uncached one)."""
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(4)
            self.proj, self.pred = nn.Linear(D_IN, D_OUT).double(), nn.Linear(D_OUT, D_OUT).double()

        def forward(self, x):
            z = self.proj(x)
            return z, self.pred(z)

    a, b = TwoHeads(), TwoHeads()
    x0, x1 = _views()
    xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()

    def loss(out0, out1):
        (z0, p0), (z1, p1) = out0, out1
        return -(nn.functional.cosine_similarity(p0, z1.detach()).mean()
                 + nn.functional.cosine_similarity(p1, z0.detach()).mean())

    loss(a(xa), a(x1)).backward()
    out = cached_forward(b, xb, 5)
    assert isinstance(out, tuple) and len(out) == 2
    loss(out, cached_forward(b, x1, 5)).backward()
    _assert_same(_grads(b) + [xb.grad], _grads(a) + [xa.grad])


def test_random_state_is_replayed():
    """Dropout draws the same masks in the replay as in the graph-free pass: the step equals an
    uncached step over the same chunks from the same random state."""
    cached, plain = _mlp(dropout=0.5), _mlp(dropout=0.5)
    loss_fn = InfoNCELoss(0.2)
    x0, x1 = _views()
    torch.manual_seed(7)
    loss_fn(_chunkwise(plain, x0, 5), _chunkwise(plain, x1, 5)).backward()
    after_plain = torch.get_rng_state()
    torch.manual_seed(7)
    loss_fn(cached_forward(cached, x0, 5), cached_forward(cached, x1, 5)).backward()
    _assert_same(_grads(cached), _grads(plain))
    assert torch.equal(torch.get_rng_state(), after_plain)  # the replay consumed nothing


def _bn_state(module: nn.Module) -> list[torch.Tensor]:
    return [b.clone() for b in module.buffers()]


def test_batch_norm_chunk_equals_the_step_over_the_same_chunks():
    """``"chunk"``: statistics per chunk, running statistics updated once per chunk (by the
    graph-free pass; the replay leaves them alone)."""
    cached, plain = _mlp(batch_norm=True), _mlp(batch_norm=True)
    loss_fn = InfoNCELoss(0.2)
    x0, x1 = _views()
    loss_fn(_chunkwise(plain, x0, 6), _chunkwise(plain, x1, 6)).backward()
    loss_fn(cached_forward(cached, x0, 6), cached_forward(cached, x1, 6)).backward()
    _assert_same(_grads(cached), _grads(plain))
    _assert_same(_bn_state(cached), _bn_state(plain))
    assert int(cached[1].num_batches_tracked) == 2 * N // 6


def test_batch_norm_frozen_equals_the_full_batch_in_eval_mode():
    """``"frozen"``: BatchNorm in eval mode in both passes, its statistics untouched, its mode
    restored; the step equals the uncached full-batch step with the same frozen layers."""
    cached, plain = _mlp(batch_norm=True), _mlp(batch_norm=True)
    with torch.no_grad():  # running statistics that are not the defaults
        cached[1].running_mean.uniform_(-1, 1)
        cached[1].running_var.uniform_(0.5, 2)
    plain.load_state_dict(cached.state_dict())
    plain[1].eval()
    before = _bn_state(cached)
    loss_fn = InfoNCELoss(0.2)
    x0, x1 = _views()
    loss_fn(plain(x0), plain(x1)).backward()
    z0 = cached_forward(cached, x0, 5, batch_norm="frozen")
    z1 = cached_forward(cached, x1, 5, batch_norm="frozen")
    assert cached[1].training
    loss_fn(z0, z1).backward()
    assert cached[1].training
    _assert_same(_grads(cached), _grads(plain))
    _assert_same(_bn_state(cached), before)


def test_without_grad_one_pass_updates_batch_norm_once():
    module = _mlp(batch_norm=True)
    x0, _ = _views()
    with torch.no_grad():
        cached_forward(module, x0, 6)
    assert int(module[1].num_batches_tracked) == N // 6


class _AutocastProbe(nn.Module):
    """Records whether CPU autocast is on at every call."""

    def __init__(self):
        super().__init__()
        self.linear, self.seen = nn.Linear(D_IN, D_OUT), []

    def forward(self, x):
        self.seen.append(torch.is_autocast_enabled("cpu"))
        return self.linear(x)


def test_replay_runs_under_the_forward_autocast():
    probe = _AutocastProbe()
    x0, x1 = (x.float() for x in _views())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z0, z1 = cached_forward(probe, x0, 8), cached_forward(probe, x1, 8)
        loss = InfoNCELoss(0.2)(z0, z1)
    assert z0.dtype == torch.bfloat16
    loss.backward()  # outside autocast, as a training loop does
    assert probe.seen == [True] * 12


def _train_step(cached: bool, scaler: torch.amp.GradScaler, accumulate: int = 2):
    """Gradient accumulation over two micro-batches, GradScaler, clipping, an SGD step."""
    model = _mlp().float()
    loss_fn = LearnableTemperatureLoss(0.1)
    opt = torch.optim.SGD([*model.parameters(), *loss_fn.parameters()], lr=0.1)
    x0, x1 = (x.float() for x in _views())
    for part in range(accumulate):
        rows = slice(part * N // accumulate, (part + 1) * N // accumulate)
        z0 = cached_forward(model, x0[rows], 5) if cached else model(x0[rows])
        z1 = cached_forward(model, x1[rows], 5) if cached else model(x1[rows])
        scaler.scale(loss_fn(z0, z1) / accumulate).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_([*model.parameters(), *loss_fn.parameters()], 0.05)
    scaler.step(opt)
    scaler.update()
    return scaled, [p.detach().clone() for p in [*model.parameters(), *loss_fn.parameters()]]


def test_grad_scaler_clipping_and_accumulation_keep_working():
    scaled_a, after_a = _train_step(False, torch.amp.GradScaler("cpu", init_scale=1024.0))
    scaled_b, after_b = _train_step(True, torch.amp.GradScaler("cpu", init_scale=1024.0))
    _assert_same(scaled_b, scaled_a, rtol=1e-5, atol=1e-3)  # the replay carries the scale
    _assert_same(after_b, after_a, rtol=1e-5, atol=1e-6)
    assert max(g.abs().max() for g in scaled_b) > 1.0  # scaled, not unscaled, gradients


class _Holder:
    def __init__(self, tensor):
        self.tensor = tensor


class _SavedBytes:
    """Peak bytes of the activations autograd keeps alive for the backward (the saved tensors
    that are no parameter's storage)."""

    def __init__(self, model: nn.Module):
        self.live = self.peak = 0
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(self, tensor):
        if tensor.untyped_storage().data_ptr() in self.params:
            return _Holder(tensor)
        size = tensor.numel() * tensor.element_size()
        self.live += size
        self.peak = max(self.peak, self.live)
        holder = _Holder(tensor)
        weakref.finalize(holder, self._free, size)
        return holder

    def _free(self, size):
        self.live -= size

    @staticmethod
    def unpack(holder):
        return holder.tensor


def _peak_saved(batch: int, size: int | None) -> int:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 4))
    x0, x1 = torch.randn(batch, 16), torch.randn(batch, 16)
    meter = _SavedBytes(model)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        z0 = cached_forward(model, x0, size) if size else model(x0)
        z1 = cached_forward(model, x1, size) if size else model(x1)
        (z0 * z1).sum().backward()  # a loss that keeps only the [batch, 4] embeddings
    return meter.peak


def test_activation_memory_grows_with_the_chunk_not_the_batch():
    cached_small, cached_large = _peak_saved(64, 16), _peak_saved(512, 16)
    plain_small, plain_large = _peak_saved(64, None), _peak_saved(512, None)
    assert plain_large > 7 * plain_small  # uncached: with the batch
    assert cached_large < 1.1 * cached_small  # cached: the embeddings only grow
    assert cached_large < plain_large / 10
    assert _peak_saved(512, 32) > 1.8 * cached_large  # and with the chunk


def test_progress_wraps_each_pass():
    calls = []

    def progress(chunks, desc):
        calls.append((desc, len(chunks)))
        return chunks

    model = _mlp()
    x0, x1 = _views()
    InfoNCELoss(0.2)(cached_forward(model, x0, 5, progress=progress), model(x1)).backward()
    assert calls == [("gradient cache: embed", 5), ("gradient cache: replay", 5)]


def test_methods_and_functions_with_module():
    model = _mlp()
    x0, _ = _views()
    head = functools.partial(model.forward)  # a function: the module must be named
    with pytest.raises(TypeError, match="pass module="):
        cached_forward(head, x0, 5)
    z = cached_forward(head, x0, 5, module=model)
    assert z.shape == (N, D_OUT)
    z.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_parameters_outside_module_are_refused_not_lost():
    model, other = _mlp(), nn.Linear(D_OUT, D_OUT).double()
    x0, _ = _views()
    z = cached_forward(lambda x: other(model(x)), x0, 5, module=model)
    with pytest.raises(ValueError, match="outside module"):
        z.sum().backward()


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"mini_batch_size": 0}, ValueError, "mini_batch_size must be >= 1"),
    ({"mini_batch_size": True}, TypeError, "mini_batch_size must be an int"),
    ({"mini_batch_size": 4, "batch_norm": "global"}, ValueError, "batch_norm must be one of"),
    ({"mini_batch_size": 4, "module": "net"}, TypeError, "module must be an nn.Module"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        cached_forward(_mlp(), _views()[0], **kwargs)


def test_bad_inputs_and_outputs():
    model = _mlp()
    x0, x1 = _views()
    with pytest.raises(ValueError, match="same number of rows"):
        cached_forward(lambda a, b: model(a), (x0, x1[:5]), 4, module=model)
    with pytest.raises(TypeError, match="inputs must be a tensor"):
        cached_forward(model, [], 4)
    with pytest.raises(ValueError, match="a row per input row"):
        cached_forward(lambda x: model(x).sum(), x0, 4, module=model)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(("inputs", "says"), [
    (None, "inputs must be a tensor or a tuple of tensors, got NoneType"),
    (3.0, "inputs must be a tensor or a tuple of tensors, got float"),
    ((torch.zeros(4, D_IN), None), "holding NoneType at index 1"),
    ({"input_ids": torch.zeros(4, D_IN)}, "got a dict: pass its tensors and an encoder taking"),
])
def test_inputs_that_are_no_tensors_are_refused_naming_inputs(inputs, says):
    """Issue 54 item 4: ``None`` and ``3.0`` gave "'NoneType' object is not iterable"; a dict
    (a tokenizer's batch) its keys' "inputs must be a tensor"."""
    with pytest.raises(TypeError) as err:
        cached_forward(_mlp(), inputs, 4)
    assert says in _one_line(err)


def test_per_sample_tensors_are_refused_before_any_chunk_runs():
    """Issue 54 item 4: a list of 40 per-sample tensors was taken as 40 positional arguments
    and failed inside the encoder's call; it is refused before the encoder runs, naming
    inputs, what the encoder takes and the way out."""
    calls = []
    model = _mlp()
    encoder = functools.partial(lambda x: calls.append(x) or model(x))
    samples = [torch.randn(3, D_IN, dtype=torch.float64) for _ in range(40)]
    with pytest.raises(TypeError) as err:
        cached_forward(encoder, samples, 8, module=model)
    message = _one_line(err)
    assert message.startswith("inputs gives encoder 40 positional argument(s)"), message
    assert "(x)" in message and "torch.stack" in message
    assert not calls
    with pytest.raises(TypeError, match=r"inputs gives encoder 40 .*encoder\(input\) does not"):
        cached_forward(model, samples, 8)  # an nn.Module: its forward's signature
    with pytest.raises(TypeError, match=r"inputs gives encoder 1 .*missing a required"):
        cached_forward(lambda a, b: model(a), torch.zeros(4, D_IN), 2, module=model)


@pytest.mark.parametrize(("returned", "says"), [
    (lambda z: None, "a chunk of 4 rows gave NoneType"),
    (lambda z: {"a": "text", "b": "text"}, "a chunk of 4 rows gave a dict of ['str', 'str']"),
    (lambda z: 3.0, "a chunk of 4 rows gave float"),
])
def test_outputs_that_are_no_tensors_are_refused_naming_what_came(returned, says):
    """Issue 54 item 4: ``None`` gave "'NoneType' object is not iterable"."""
    model = _mlp()
    with pytest.raises(ValueError) as err:
        cached_forward(lambda x: returned(model(x)), _views()[0], 4, module=model)
    message = _one_line(err)
    assert message.startswith("encoder must return tensors") and message.endswith(says), message


def test_an_output_structure_that_changes_between_chunks_is_refused():
    model = _mlp()
    calls = []

    def encoder(x):
        calls.append(1)
        return (model(x),) if len(calls) == 1 else {"z": model(x)}

    with pytest.raises(ValueError) as err:
        cached_forward(encoder, _views()[0], 8, module=model)
    assert _one_line(err).endswith(
        "a chunk of 8 rows gave a dict of [(8, 6)], the first a tuple of [(8, 6)]")


class _Features(nn.Module):
    """A sentence-transformers model's call: a dict of features in, the dict out with
    ``sentence_embedding`` (and ``token_embeddings``) added."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.token = nn.Linear(D_IN, D_OUT).double()

    def forward(self, input_ids, attention_mask):
        tokens = self.token(input_ids)                      # [rows, D_OUT] stands for tokens
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "token_embeddings": tokens.unsqueeze(1).expand(-1, 3, -1),
                "sentence_embedding": tokens * attention_mask[:, :1], "cache": None}


def test_dict_outputs_keep_their_structure_and_train_as_uncached():
    """A dict (sentence-transformers' features), ``None`` entries and integer tensors
    included: the whole batch's dict comes back, and the step equals the uncached one."""
    cached, plain = _Features(), _Features()
    x0, x1 = _views()
    mask = torch.ones(N, 4, dtype=torch.int64)
    want = [plain(x, mask) for x in (x0, x1)]
    got = [cached_forward(cached, (x, mask), 5) for x in (x0, x1)]
    assert all(type(g) is dict and list(g) == list(w) for g, w in zip(got, want, strict=True))
    assert got[0]["cache"] is None and got[0]["attention_mask"].dtype == torch.int64
    for g, w in zip(got, want, strict=True):
        for key in ("input_ids", "attention_mask", "token_embeddings", "sentence_embedding"):
            torch.testing.assert_close(g[key], w[key], **EXACT)
    loss_fn = InfoNCELoss(0.2)
    loss_fn(*(w["sentence_embedding"] for w in want)).backward()
    loss_fn(*(g["sentence_embedding"] for g in got)).backward()
    _assert_same(_grads(cached), _grads(plain))


def test_a_hugging_face_model_output_comes_back_as_itself():
    """A ``ModelOutput`` (what a Hugging Face model returns) comes back of its own class, each
    field the whole batch's, with the uncached step's gradients."""
    outputs = pytest.importorskip("transformers.modeling_outputs")

    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(6)
            self.body, self.pool = nn.Linear(D_IN, D_OUT).double(), nn.Linear(D_OUT, D_OUT).double()

        def forward(self, x):
            hidden = self.body(x)
            return outputs.BaseModelOutputWithPooling(last_hidden_state=hidden,
                                                      pooler_output=self.pool(hidden).tanh())

    cached, plain = Tower(), Tower()
    x0, x1 = _views()
    z = cached_forward(cached, x0, 7)
    assert type(z) is outputs.BaseModelOutputWithPooling and z.hidden_states is None
    assert z.pooler_output.shape == (N, D_OUT)
    loss_fn = InfoNCELoss(0.2)
    loss_fn(plain(x0).pooler_output, plain(x1).pooler_output).backward()
    loss_fn(z.pooler_output, cached_forward(cached, x1, 7).pooler_output).backward()
    _assert_same(_grads(cached), _grads(plain))

"""Two gloo processes: the drop-ins against open_clip's ``ClipLoss`` run the same way, in every
``local_loss`` x ``gather_with_grad`` combination, and against the single-process full batch.

What open_clip's combinations give (and so ours): the loss value is the full batch's in all
four (``local_loss=False``: every rank computes the whole batch; ``True``: the mean over ranks
of the local rows). The gradient of a rank's features is ``world`` times the full batch's with
``gather_with_grad`` (DDP's average over ranks then gives the full gradient), the full batch's
itself with ``local_loss=False`` alone (the local features put back into the gathered tensor),
and only the local rows' share with ``local_loss=True`` alone (no gathered column carries a
gradient). The logit scale is every rank's replica: the mean of the ranks' gradients is the
full batch's.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

open_clip_loss = pytest.importorskip("open_clip.loss")

from adaptcl.adapters.open_clip import (  # noqa: E402
    DySTreSSClipLoss,
    InfoNCEClipLoss,
    MACLClipLoss,
)

from ..._distributed import full_batch, gloo_results  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:DySTreSSClipLoss ignores logit_scale")

WORLD = 2
N, D = 5, 8
COMBOS = list(itertools.product((False, True), (False, True)))  # (local_loss, gather_with_grad)
#: classes of the full batch, each with pairs on both ranks
LABELS = torch.tensor([0, 1, 2, 0, 3, 1, 0, 2, 4, 1])

CASES = {
    # name: (our loss from ClipLoss's keyword arguments, call keywords, open_clip's peer or None)
    "infonce": (lambda **kw: InfoNCEClipLoss(**kw), False, True),
    "infonce_tiled": (lambda **kw: InfoNCEClipLoss(tile_size=3, **kw), False, True),
    "macl": (lambda **kw: MACLClipLoss(alpha=0.5, a0=0.2, **kw), False, False),
    "macl_labels": (lambda **kw: MACLClipLoss(alpha=2.0, a0=0.3, reweight=False, **kw), True,
                    False),
    "infonce_labels": (lambda **kw: InfoNCEClipLoss(tile_size=4, **kw), True, False),
    "dystress_labels": (lambda **kw: DySTreSSClipLoss(min_temperature=0.05, **kw), True, False),
}


def _full_batch():
    return full_batch(N, D, WORLD, dtype=torch.float64)


def _step(fn, image, text, labels=None) -> dict:
    """Value and gradients (features before the model's normalisation, the log scale) of one
    call, as open_clip's model feeds the loss: unit features and ``logit_scale.exp()``."""
    x0, x1 = image.clone().requires_grad_(), text.clone().requires_grad_()
    s = torch.tensor(math.log(1 / 0.07), dtype=torch.float64, requires_grad=True)
    kwargs = {} if labels is None else {"labels": labels}
    loss = fn(F.normalize(x0, dim=-1), F.normalize(x1, dim=-1), s.exp(), **kwargs)
    loss.backward()
    return {"loss": loss.item(), "g0": x0.grad, "g1": x1.grad, "gs": s.grad.item(),
            "temperature": getattr(fn, "last_stats", {}).get("temperature")}


def _rank(rank: int) -> dict:
    """Every case and combination on ``rank``'s rows (in a gloo process group)."""
    image, text = (x[rank * N:(rank + 1) * N] for x in _full_batch())
    labels = LABELS[rank * N:(rank + 1) * N]
    out = {}
    for (local, with_grad), (name, (make, labelled, peer)) in itertools.product(
            COMBOS, CASES.items()):
        kw = {"local_loss": local, "gather_with_grad": with_grad, "rank": rank,
              "world_size": WORLD}
        key = f"{name}-{local}-{with_grad}"
        out[key] = _step(make(**kw), image, text, labels if labelled else None)
        if peer:
            out[key + "-peer"] = _step(open_clip_loss.ClipLoss(**kw), image, text)
    return out


@pytest.fixture(scope="module")
def ranks():
    return gloo_results(_rank, WORLD)


def _close(a, b) -> None:
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # two processes importing open_clip, paid once by the module
@pytest.mark.parametrize(("local", "with_grad"), COMBOS)
@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[2]])
def test_equals_open_clip_cliploss_run_the_same_way(ranks, name, local, with_grad):
    for rank in range(WORLD):
        ours, theirs = (ranks[rank][f"{name}-{local}-{with_grad}{tail}"] for tail in ("", "-peer"))
        for key in ("loss", "g0", "g1", "gs"):
            _close(ours[key], theirs[key])


@pytest.mark.slow
@pytest.mark.parametrize(("local", "with_grad"), COMBOS)
@pytest.mark.parametrize("name", list(CASES))
def test_equals_the_single_process_full_batch(ranks, name, local, with_grad):
    make, labelled, _ = CASES[name]
    full = _step(make(), *_full_batch(), LABELS if labelled else None)
    got = [ranks[rank][f"{name}-{local}-{with_grad}"] for rank in range(WORLD)]
    _close(sum(r["loss"] for r in got) / WORLD, full["loss"])
    _close(sum(r["gs"] for r in got) / WORLD, full["gs"])  # DDP's mean of the replicas
    if local and not with_grad:
        return  # open_clip's local rows only: no full-batch gradient to compare with
    factor = WORLD if with_grad else 1
    for rank, r in enumerate(got):
        rows = slice(rank * N, (rank + 1) * N)
        _close(r["g0"] / factor, full["g0"][rows])
        _close(r["g1"] / factor, full["g1"][rows])
    if name.startswith("macl"):  # the alignment is all-reduced: the full batch's temperature
        for r in got:
            _close(r["temperature"], full["temperature"])

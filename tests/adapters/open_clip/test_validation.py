"""A user's mistake with a drop-in for ``ClipLoss`` is one line naming the bad argument, raised
before any work."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("open_clip.loss")

from adaptcl.adapters.open_clip import (  # noqa: E402
    DCLClipLoss,
    DySTreSSClipLoss,
    InfoNCEClipLoss,
    MACLClipLoss,
    TemperatureScheduleClipLoss,
)

F = torch.randn(4, 8)
T = torch.randn(4, 8)
SCALE = torch.tensor(14.0)


def _one_line(excinfo, *words):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"local_loss": 1}, TypeError, ("local_loss", "bool")),
    ({"gather_with_grad": "yes"}, TypeError, ("gather_with_grad",)),
    ({"cache_labels": None}, TypeError, ("cache_labels",)),
    ({"world_size": 0}, ValueError, ("world_size", ">= 1")),
    ({"rank": -1}, ValueError, ("rank",)),
    ({"rank": 2, "world_size": 2}, ValueError, ("rank must be < world_size = 2",)),
    ({"rank": 1.0, "world_size": 2}, TypeError, ("rank", "int")),
    ({"tile_size": 0}, ValueError, ("tile_size",)),
])
def test_cliploss_arguments(kwargs, error, words):
    with pytest.raises(error) as excinfo:
        InfoNCEClipLoss(**kwargs)
    _one_line(excinfo, *words)


def test_horovod_refused_unless_importable():
    import open_clip.loss

    if open_clip.loss.hvd is not None:  # pragma: no cover - horovod is not installed here
        pytest.skip("horovod is installed")
    with pytest.raises(ImportError) as excinfo:
        MACLClipLoss(use_horovod=True)
    _one_line(excinfo, "use_horovod=True needs horovod")


@pytest.mark.parametrize(("make", "error", "words"), [
    (lambda: MACLClipLoss(alpha=-1.0), ValueError, ("alpha",)),
    (lambda: MACLClipLoss(temperature_form="log"), ValueError, ("temperature_form",)),
    (lambda: MACLClipLoss(min_temperature=0.0), ValueError, ("min_temperature",)),
    (lambda: MACLClipLoss(reweight=True, positive_in_denominator=False), ValueError,
     ("reweight=True needs positive_in_denominator=True",)),
    (lambda: DySTreSSClipLoss(min_temperature=0.3, max_temperature=0.2), ValueError,
     ("min_temperature must be <= max_temperature",)),
    (lambda: DySTreSSClipLoss(shape="linear"), ValueError, ("shape",)),
    (lambda: TemperatureScheduleClipLoss(period=0), ValueError, ("period",)),
    (lambda: InfoNCEClipLoss(temperature=0.1), TypeError, ("temperature",)),
])
def test_method_arguments(make, error, words):
    with pytest.raises(error) as excinfo:
        make()
    _one_line(excinfo, *words)


@pytest.mark.parametrize(("args", "kwargs", "error", "words"), [
    ((F[:3], T, SCALE), {}, ValueError, ("image_features and text_features must have the same "
                                         "shape",)),
    ((F.long(), T, SCALE), {}, TypeError, ("image_features", "floating-point")),
    ((F, T[:, :, None], SCALE), {}, ValueError, ("text_features", "[batch, dim]")),
    ((F[:0], T[:0], SCALE), {}, ValueError, ("at least one pair",)),
    ((F * float("nan"), T, SCALE), {}, ValueError, ("image_features contains NaN",)),
    ((F, T, torch.tensor([1.0, 2.0])), {}, ValueError, ("logit_scale must be a scalar",)),
    ((F, T, torch.tensor(-2.0)), {}, ValueError, ("logit_scale must be a finite number > 0",)),
    ((F, T, 0.0), {}, ValueError, ("logit_scale",)),
    ((F, T, "14"), {}, TypeError, ("logit_scale",)),
    ((F, T, SCALE, torch.zeros(4)), {}, ValueError, ("logit_bias must be a scalar",)),
    ((F, T, SCALE), {"output_dict": 1}, TypeError, ("output_dict",)),
    ((F, T, SCALE), {"labels": torch.zeros(3, dtype=torch.long)}, ValueError, ("labels",)),
    ((F, T, SCALE), {"labels": torch.zeros(4)}, TypeError, ("labels", "integer")),
    ((F, T, SCALE), {"labels": torch.tensor([0, 1, -1, 2])}, ValueError, ("labels must be >= 0",)),
])
def test_call_arguments(args, kwargs, error, words):
    with pytest.raises(error) as excinfo:
        InfoNCEClipLoss()(*args, **kwargs)
    _one_line(excinfo, *words)


@pytest.mark.parametrize(("loss", "error", "words"), [
    (DCLClipLoss(), TypeError, ("DCLClipLoss takes no labels",)),
    (TemperatureScheduleClipLoss(), TypeError, ("TemperatureScheduleClipLoss takes no labels",)),
    (MACLClipLoss(), ValueError, ("labels need reweight=False",)),
    (DySTreSSClipLoss(positive_in_denominator=False), ValueError,
     ("labels need positive_in_denominator=True",)),
])
def test_labels_refused_where_undefined(loss, error, words):
    with pytest.raises(error) as excinfo:
        loss(F, T, SCALE, labels=torch.arange(4))
    _one_line(excinfo, *words)


def test_several_ranks_without_a_process_group():
    loss = InfoNCEClipLoss(rank=1, world_size=2)
    with pytest.raises(ValueError) as excinfo:
        loss(F, T, SCALE)
    _one_line(excinfo, "world_size=2 needs an initialised torch.distributed process group")


def test_bad_call_changes_no_state():
    """Checked before any work: a refused call neither counts a schedule step nor caches."""
    loss = TemperatureScheduleClipLoss(cache_labels=True)
    with pytest.raises(ValueError):
        loss(F, T, torch.tensor(-1.0))
    assert loss.step == 0 and loss.labels == {} and loss.last_stats == {}

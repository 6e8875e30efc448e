"""Closed sets of choices are ``typing.Literal`` in the public signatures (as sentence-transformers
writes them) and still checked at construction (a Literal is not enforced at run time).

Each Literal is defined once, next to the tuple of choices that the run-time check uses
(``FORMS = get_args(Form)``), so the two cannot drift; the tests below hold each public tuple to
its Literal, and every public loss, module and functional form whose signature shows a Literal
to refusing a value outside it, by name."""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Sequence

import pytest
import torch

# (module, Literal, tuple of choices)
PAIRS = [
    ("adaptcl.plugins.candidates", "Form", "FORMS"),
    ("adaptcl.plugins.base", "Reduction", "REDUCTIONS"),
    ("adaptcl.plugins.hardness", "HardnessMode", "HARDNESS_MODES"),
    ("adaptcl.plugins.dystress", "Shape", "SHAPES"),
    ("adaptcl.plugins.amcl", "NegativeTerm", "NEGATIVE_TERMS"),
    ("adaptcl.plugins.amcl", "Objective", "OBJECTIVES"),
    ("adaptcl.plugins.macl", "TemperatureForm", "TEMPERATURE_FORMS"),
    ("adaptcl.plugins.macl", "WeightForm", "WEIGHT_FORMS"),
    ("adaptcl.plugins.ascl", "ASCLMode", "MODES"),
    ("adaptcl.plugins.ascl", "ASCLForm", "ASCL_FORMS"),
    ("adaptcl.plugins.survey", "Mining", "MINING"),
    ("adaptcl.plugins.execution", "Backward", "BACKWARDS"),
    ("adaptcl.precision", "Precision", "PRECISIONS"),
    ("adaptcl.adapters.lightly.memory_bank", "InBatchForm", "IN_BATCH_FORMS"),
    ("adaptcl.adapters.lightning.methods", "Backbone", "BACKBONES"),
    ("adaptcl.adapters.lightning.methods", "Method", "METHODS"),
    ("adaptcl.adapters.lightning.base", "OptimizerName", "OPTIMIZERS"),
    ("adaptcl.adapters.lightning.base", "LRSchedule", "LR_SCHEDULES"),
    ("adaptcl.adapters.graphcl.lightning", "OptimizerName", "OPTIMIZERS"),
    ("adaptcl.adapters.graphcl.transforms", "MaskMode", "MASK_MODES"),
    ("adaptcl.adapters.sentence_transformers.losses", "Direction", "DIRECTIONS"),
    ("adaptcl.adapters.sentence_transformers.losses", "PartitionMode", "PARTITION_MODES"),
]

#: the public modules whose signatures take these choices
MODULES = ["adaptcl.plugins", "adaptcl.plugins.functional", "adaptcl.adapters.lightly",
           "adaptcl.adapters.sentence_transformers.losses",
           "adaptcl.adapters.sentence_transformers.temperatures", "adaptcl.adapters.open_clip",
           "adaptcl.adapters.graphcl.transforms"]


def _module(name: str):
    parts = name.split(".")
    if "adapters" in parts:
        pytest.importorskip({"lightly": "lightly", "lightning": "lightly", "graphcl": "torch_geometric",
                             "sentence_transformers": "sentence_transformers",
                             "open_clip": "open_clip"}[parts[2]])
    return importlib.import_module(name)


@pytest.mark.parametrize("module, literal, choices", PAIRS, ids=[f"{m}.{c}" for m, _, c in PAIRS])
def test_each_tuple_of_choices_is_its_literal(module, literal, choices):
    mod = _module(module)
    alias = getattr(mod, literal)
    assert typing.get_origin(alias) is typing.Literal
    if choices is None:  # a Literal no argument takes (an attribute's type): no tuple to hold
        return
    values = getattr(mod, choices)
    assert isinstance(values, tuple) and values == typing.get_args(alias)
    assert len(set(values)) == len(values)


def _choices(hint) -> tuple[tuple[str, ...], bool] | None:
    """``(choices, sequence)`` of a ``Literal``, ``Literal | None`` or ``Sequence[Literal]`` hint."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint), False
    for arg in typing.get_args(hint):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg), False
        inner = typing.get_args(arg)
        if typing.get_origin(arg) is Sequence and typing.get_origin(inner[0]) is typing.Literal:
            return typing.get_args(inner[0]), True
    return None


def _public_callables():
    for name in MODULES:
        module = _module(name)
        for attr in sorted(getattr(module, "__all__", ())):
            obj = getattr(module, attr)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{name}.{attr}", obj


_TENSORS = {name: torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            for i, name in enumerate(("z0", "z1", "predictions", "targets"))}


def _required(obj) -> dict | None:
    """Arguments for the parameters without a default, or None where we have none to give."""
    init = obj.__init__ if inspect.isclass(obj) else obj
    given = {}
    for p in list(inspect.signature(init).parameters.values())[1 if inspect.isclass(obj) else 0:]:
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in _TENSORS:
            given[p.name] = _TENSORS[p.name]
        elif p.name == "model":
            given[p.name] = None
        else:
            return None
    try:
        obj(**given)  # the defaults must work with these, else there is nothing to vary
    except (TypeError, ValueError):
        return None
    return given


def test_every_public_signature_shows_its_choices_and_refuses_the_others():
    """Each public class and function with a Literal parameter: the hints resolve (autodoc and
    type checkers read them), the default is among the choices, and a value outside them is
    refused at once with an error naming the parameter."""
    checked = 0
    for qualified, obj in _public_callables():
        init = obj.__init__ if inspect.isclass(obj) else obj
        hints = typing.get_type_hints(init)
        required = _required(obj)
        for name, parameter in inspect.signature(init).parameters.items():
            found = _choices(hints.get(name))
            if found is None:
                continue
            choices, sequence = found
            default = parameter.default
            if default not in (None, inspect.Parameter.empty):
                assert set(default if sequence else [default]) <= set(choices), qualified
            if required is None:
                continue
            bad = ("__not_a_choice__",) if sequence else "__not_a_choice__"
            with pytest.raises((ValueError, TypeError), match=name):
                obj(**required, **{name: bad})
            checked += 1
    assert checked > 60  # the loss core's forms, reductions, modes and the adapters' own


def test_tile_size_is_the_only_tiling_keyword_everywhere_and_refused_by_name():
    """Issue 47: every public loss, adapter and functional form takes ``tile_size: TileSize =
    "auto"`` and no other tiling keyword (``tile_backend`` and ``max_logits_bytes`` are fields
    of the scoped setting ``adaptcl.plugins.tiling``, issue 53); a value outside ``None``,
    ``"auto"`` and the ints >= 1 is refused at construction naming ``tile_size``."""
    from adaptcl.plugins import TilingSetting
    from adaptcl.plugins.validation import TileSize

    seen, refused = [], 0
    for qualified, obj in _public_callables():
        init = obj.__init__ if inspect.isclass(obj) else obj
        parameters = inspect.signature(init).parameters
        if obj is not TilingSetting:
            assert not {"tile_backend", "max_logits_bytes"} & set(parameters), qualified
        if "tile_size" not in parameters:
            continue
        assert typing.get_type_hints(init)["tile_size"] == TileSize, qualified
        assert parameters["tile_size"].default == "auto", qualified
        seen.append(qualified)
        required = _required(obj)
        if required is None:
            continue
        for bad, error in (("big", ValueError), (0, ValueError), (2.0, TypeError),
                           (True, TypeError)):
            with pytest.raises(error, match="^tile_size must be an int >= 1, 'auto' or None"):
                obj(**required, tile_size=bad)
        refused += 1
    names = {q.rsplit(".", 1)[1] for q in seen}
    # the loss core (modules and functional forms) and each adapter's losses
    assert {"InfoNCELoss", "info_nce", "MACLLoss", "macl", "AMCLLoss", "amcl", "TripletLoss",
            "nce", "NTXentLoss", "InfoNCEClipLoss", "DySTreSSClipLoss", "ASCLBYOLLoss",
            "ascl_byol", "DySTreSSLoss", "LearnableTemperatureLoss"} <= names, names
    assert refused > 40

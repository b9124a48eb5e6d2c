"""Matching new weights to a model's tensors by name: one rule for every ``set-weights``.

ONNX (:func:`torchless.formats.onnx.write.set_weights`) and TorchScript
(:func:`torchless.formats.torchscript.write.set_weights`) both take a weights file or
mapping, remove ``strip_prefix`` from each weight's name, and match the result against
the model's tensor names:

* two weights that map to one tensor are refused (``UsageError``);
* weights that name no tensor are refused (``NotFoundError``, listing them) unless
  ``allow_missing``, and are reported as ``ignored`` (names after stripping);
* weights were given but none matched: refused even with ``allow_missing``
  (``UsageError``): writing the model unchanged is never what was asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import NotFoundError, UsageError

__all__ = ["WeightMatch", "match_weights", "weight_items"]


@dataclass
class WeightMatch:
    """The outcome of :func:`match_weights`.

    Attributes:
        matched: ``(model tensor name, value)`` for every weight that names a tensor.
        ignored: the (stripped) names of weights that name no tensor, in order.
        shapes: stripped name -> shape of every weight given.
    """

    matched: list[tuple[str, Any]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def weight_items(weights: Any) -> tuple[list[tuple[str, Any]], Any]:
    """``(name, tensor)`` pairs of ``weights`` (a mapping, ``(name, tensor)`` pairs, or a
    path of any readable format: ``.pt`` opened with ``weights_only=True``), and the opened
    artifact to close once the values are written (None for in-memory weights)."""
    if isinstance(weights, Mapping):
        return list(weights.items()), None
    if isinstance(weights, (str, os.PathLike)):
        from .dispatch import open_artifact

        art = open_artifact(weights)
        return list(art.tensors()), art
    return list(weights), None


def match_weights(
    items: Iterable[tuple[str, Any]],
    names: Collection[str],
    *,
    strip_prefix: str = "",
    allow_missing: bool = False,
    what: str = "tensor",
    path: Any = None,
    check: Callable[[WeightMatch], None] | None = None,
) -> WeightMatch:
    """Match weights to the model's tensor ``names`` (see the module docstring).

    Args:
        items: ``(name, value)`` pairs of the new weights.
        names: the model's tensor names a weight may replace.
        strip_prefix: removed from the start of each weight name first (``"model."``).
        allow_missing: report weights that name no tensor instead of refusing them.
        what: what a tensor is called in this format (``"initializer"``), for messages.
        path: the model, for messages.
        check: a format's own refusal, run on the match before the missing names are
            refused (ONNX explains renamed initializers this way).

    Raises:
        UsageError: two weights map to one name, or none matched.
        NotFoundError: weights that name no tensor, without ``allow_missing``.
    """
    m = WeightMatch()
    seen: set[str] = set()
    given = False
    for name, value in items:
        given = True
        key = name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name
        m.shapes[key] = tuple(getattr(value, "shape", ()))
        if key not in names:
            m.ignored.append(key)
            continue
        if key in seen:
            raise UsageError(f"two weights map to {what} {key!r}", path=path, member=key)
        seen.add(key)
        m.matched.append((key, value))
    if check is not None:
        check(m)
    if m.ignored and not allow_missing:
        raise NotFoundError(
            f"{len(m.ignored)} weights name no {what} of the model",
            path=path,
            found=", ".join(m.ignored[:5]) + (" ..." if len(m.ignored) > 5 else ""),
            hint="check names with `torchless ls` on both files, or pass --allow-missing / --strip-prefix",
        )
    if given and not m.matched:
        raise UsageError(
            f"no {what} was replaced: none of the weights names {_a(what)} of the model",
            path=path,
            hint="compare names with `torchless ls` on both files (--strip-prefix removes a prefix)",
        )
    return m


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word

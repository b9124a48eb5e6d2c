"""The one rule for tensors that share a storage (tied weights), for every writer.

A ``.pt`` file, a ``torch.save`` ``.bin`` shard set and a ``.pt2`` archive keep the sharing
(torch's own storages). ``.npz`` (like ``numpy.savez``) writes every name with its own copy.
safetensors cannot express sharing; torchless follows ``transformers``' ``save_pretrained``
and ``safetensors.torch.save_model`` there, whatever the source (one ``.pt``/``.bin`` file,
a Hugging Face folder, a DCP checkpoint, tensors handed to ``write_tensors``):

* an exact alias of an earlier tensor (same storage, offset, shape, strides, dtype and
  conj/neg bits) is stored once, under the first name; the alias is not written, the
  index does not list it, ``convert`` lists it in ``dropped`` (and ``--strict`` refuses),
  and the file's ``__metadata__`` records ``{alias: kept name}`` as ``save_model`` does
  (``transformers`` re-ties the alias from the model on load);
* views of one storage whose bytes do not overlap (slices of a fused buffer) are each
  written as their own tensor (``save_pretrained`` clones them);
* views that overlap without being the same view are refused, naming both (what
  ``save_pretrained`` and ``save_file`` refuse too).

Storages are told apart by the :class:`~torchless.core.tensor.Storage` objects
themselves, held while the rule runs, never by ``id()`` of a temporary.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import UsageError
from ..core.tensor import Storage, Tensor, as_tensor

__all__ = ["split_aliases", "alias_metadata", "drops_aliases", "dropped_entries", "ALIAS_NOTE"]

#: the ``type`` of a ``dropped`` entry for an alias (``{kept}`` is the name written)
ALIAS_NOTE = "alias of {kept} (one storage; safetensors stores it once)"


def drops_aliases(dst: Any, format: str | None) -> bool:
    """True when writing ``format`` to ``dst`` stores exact aliases once (safetensors, a
    single file or a Hugging Face safetensors set); other destinations keep every name."""
    from .hf.spec import INDEX_SUFFIX

    if format == "safetensors":
        return True
    if format == "hf" and isinstance(dst, (str, os.PathLike)):
        p = os.fspath(dst)
        return p.endswith(".safetensors" + INDEX_SUFFIX) or p.endswith(".safetensors")
    return False


def _span(t: Tensor) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` of the storage that ``t``'s elements lie in (empty: ``(0, 0)``)."""
    if t.numel() == 0:
        return 0, 0
    last = t.storage_offset() + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=False))
    return t.storage_offset() * t.dtype.itemsize, (last + 1) * t.dtype.itemsize


def split_aliases(items: Iterable[tuple[str, Any]], path: Any = None) -> tuple[list[tuple[str, Tensor]], dict[str, str]]:
    """``(kept, {alias: kept name})``: every tensor but the exact aliases, coerced, in order.

    Raises:
        UsageError: two tensors overlap in one storage without being the same view.
    """
    kept: list[tuple[str, Tensor]] = []
    aliases: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}  # the view (its Storage held) -> the name kept
    spans: dict[Storage, tuple[list[int], list[tuple[int, str]]]] = {}  # sorted starts, (end, name)
    share: dict[Any, Any] = {}  # torch tensors sharing a storage share one Storage (held here)
    for name, v in items:
        t = as_tensor(v, share=share, name=name)
        st = t.storage
        if st is None:
            kept.append((name, t))
            continue
        md = tuple(sorted((k, bool(x)) for k, x in t.metadata.items()))
        view = (st, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype.name, md)
        if view in first:
            aliases[name] = first[view]
            continue
        lo, hi = _span(t)
        if hi > lo:
            starts, ends = spans.setdefault(st, ([], []))
            i = bisect.bisect_right(starts, lo)
            clash = None
            if i > 0 and ends[i - 1][0] > lo:
                clash = ends[i - 1][1]
            elif i < len(starts) and starts[i] < hi:
                clash = ends[i][1]
            if clash is not None:
                raise UsageError(
                    f"tensors {clash!r} and {name!r} overlap in one storage as different views; "
                    "safetensors cannot store shared memory",
                    path=path,
                    member=name,
                    hint="write .pt or .bin shards (torch keeps the sharing), or make the tensors independent copies first",
                )
            starts.insert(i, lo)
            ends.insert(i, (hi, name))
        first[view] = name
        kept.append((name, t))
    return kept, aliases


def alias_metadata(metadata: Mapping[str, str] | None, aliases: Mapping[str, str]) -> dict[str, str] | None:
    """``metadata`` with ``{alias: kept}`` added for each alias it does not name already
    (``safetensors.torch.save_model``'s record; the caller's own keys win)."""
    if not aliases:
        return dict(metadata) if metadata else None
    out = dict(metadata or {})
    for a, k in aliases.items():
        out.setdefault(a, k)
    return out


def dropped_entries(aliases: Mapping[str, str]) -> list[dict[str, str]]:
    """``convert``'s ``dropped`` entries for the aliases not written."""
    return [{"key": a, "type": ALIAS_NOTE.format(kept=k)} for a, k in aliases.items()]

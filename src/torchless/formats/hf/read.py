"""Reading a Hugging Face checkpoint folder as one artifact.

The artifact is the folder (or its index file). With an index, the shards are the files
its ``weight_map`` names; without one, the shards named ``<stem>-NNNNN-of-NNNNN.<ext>``,
or the single ``model.safetensors`` / ``pytorch_model.bin``, or every ``.safetensors``
file. Each shard is opened with its own format's reader (safetensors headers, or the
safe pickle machine for ``.bin``): nothing in any shard is imported or run. Every name
taken from the index or the listing goes through :func:`~torchless.io.paths.confined_file`.

:meth:`HFArtifact.verify` checks the index the way a loader relies on it: every
``weight_map`` entry is in the shard it names, no tensor is in two shards, no shard holds
a tensor the index does not list, ``metadata.total_size`` matches the shards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from ...core import jsonsafe
from ...core.errors import FormatError, LimitError, NotFoundError, TorchlessError, short_repr
from ...core.findings import Problem
from ...core.tree import iter_tensors
from ...io import remote
from ...io.paths import confined_file
from ...io.source import RemoteSource
from ..base import Artifact, LoadPolicy, summarize_tensors
from ..ranks import member_problems
from .spec import KINDS, SHARD_RE, SINGLE_FILES, index_names, is_index_file

__all__ = ["HFArtifact", "MAX_INDEX_BYTES", "MAX_SHARDS"]

MAX_INDEX_BYTES = 256 << 20
MAX_SHARDS = 100_000


def _kind(name: str) -> str:
    for ext, kind in KINDS.items():
        if name.endswith(ext):
            return kind
    raise FormatError(
        "a shard must be a .safetensors or .bin file", member=name, expected="one of: " + ", ".join(KINDS), found=repr(name)[:80]
    )


class HFArtifact(Artifact):
    """A Hugging Face checkpoint: shards (safetensors or torch ``.bin``) and their index.

    Attributes:
        folder: the checkpoint's folder.
        index: the index file's name, or None.
        index_data: the parsed index (``metadata``, ``weight_map``), or None.
        shard_files: the shard file names in file order (sorted, as transformers loads them).
        serialization: ``"safetensors"`` or ``"bin"``.
    """

    format = "hf"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, store: Any = None) -> None:
        super().__init__(path, policy, store=store)
        p = os.fspath(path)
        store = self.store  # where its files live: handed over by detection, or resolved once
        self.remote = store.remote
        if store.isdir(p):
            self.folder = p
            found = index_names(p, store)
            self.index = found[0] if found else None
            self.other_indexes = found[1:]
        else:
            if self.remote:
                remote.check_exists(p)  # missing, or the store's reason it cannot tell
            elif not os.path.exists(p):
                raise NotFoundError("no such file or directory", path=p)
            self.folder = remote.dirname(p) if self.remote else (os.path.dirname(p) or ".")
            self.index = remote.basename(p) if self.remote else os.path.basename(p)
            self.other_indexes = []
            if not is_index_file(self.index):
                raise FormatError(
                    "not a Hugging Face index file",
                    path=p,
                    expected="<name>.safetensors.index.json or <name>.bin.index.json",
                    found=repr(self.index)[:80],
                )
        self.index_data: dict[str, Any] | None = None
        self.weight_map: dict[str, str] = {}
        if self.index is not None:
            self._read_index()
            self.shard_files = sorted(set(self.weight_map.values()))  # file order, as transformers loads them
        else:
            self.shard_files = self._list_shards()
        if not self.shard_files:
            raise FormatError(
                "no shards", path=self.path, expected="a weight_map naming shard files, or shard files in the folder"
            )
        if len(self.shard_files) > MAX_SHARDS:
            raise LimitError("too many shards", path=self.path, expected=f"<= {MAX_SHARDS}", found=len(self.shard_files))
        kinds = {_kind(n) for n in self.shard_files}
        if len(kinds) != 1:
            raise FormatError("shards of both kinds (.bin and .safetensors) in one index", path=self.path, found=sorted(kinds))
        self.serialization = kinds.pop()
        self._shards: dict[str, Artifact] = {}
        self._tensors: dict[str, Any] | None = None
        self._where: dict[str, str] = {}
        self._dups: list[tuple[str, str, str]] = []

    # -- the index -----------------------------------------------------------------
    def _read_index(self) -> None:
        assert self.index is not None
        if self.remote:
            where = remote.child(self.folder, self.index, what="index file")
            src = RemoteSource(where)
            size = src.size
        else:
            where = os.path.join(self.folder, self.index)
            real = confined_file(self.folder, self.index, what="index file", path=where)
            size = os.path.getsize(real)
        if size > MAX_INDEX_BYTES:
            raise LimitError("index file too large", path=where, expected=f"<= {MAX_INDEX_BYTES} bytes", found=size)
        if self.remote:
            raw = src.read_at(0, size)
        else:
            with open(real, "rb") as f:
                raw = f.read()
        data = jsonsafe.loads(raw, what="index file", path=where, max_bytes=MAX_INDEX_BYTES, max_depth=8)
        if not isinstance(data, dict):
            raise FormatError("the index is not a JSON object", path=where, found=type(data).__name__)
        wm = data.get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise FormatError(
                "the index's weight_map must map tensor names to shard file names",
                path=where,
                member="weight_map",
                found=short_repr(wm, 80),
            )
        meta = data.get("metadata", {})
        if not isinstance(meta, dict):
            raise FormatError("the index's metadata must be an object", path=where, member="metadata", found=short_repr(meta, 80))
        self.index_data = data
        self.weight_map = dict(wm)

    def _list_shards(self) -> list[str]:
        names = self.store.list(self.folder)
        groups: dict[tuple[str, str, str], list[str]] = {}
        for n in names:
            m = SHARD_RE.match(n)
            if m:
                groups.setdefault((m["stem"], m["n"], m["ext"]), []).append(n)
        if groups:
            # prefer safetensors, then the most complete set
            key = max(groups, key=lambda k: (k[2] == "safetensors", len(groups[k])))
            return groups[key]
        for n in SINGLE_FILES:
            if n in names:
                return [n]
        return [n for n in names if n.endswith(".safetensors")]

    # -- shards --------------------------------------------------------------------
    def shard(self, name: str) -> Artifact:
        """The opened shard ``name`` (opened on first use, confined to the folder)."""
        art = self._shards.get(name)
        if art is None:
            shown = os.path.join(self.folder, self.index or "")
            if self.remote:
                real = remote.child(self.folder, name, what="shard", path=shown, member=name)
            else:
                real = confined_file(self.folder, name, what="shard", path=shown, member=name)
            if _kind(name) == "safetensors":
                from ..safetensors import SafetensorsArtifact

                art = SafetensorsArtifact(real, self.policy)
            else:
                from ..pt.handler import PtArtifact

                art = PtArtifact(real, self.policy)
            self._shards[name] = art
        return art

    def _shard_tensors(self, name: str) -> list[tuple[str, Any]]:
        art = self.shard(name)
        if self.serialization == "bin":
            return list(iter_tensors(art.load()))
        return list(art.tensors())

    def _collect(self) -> dict[str, Any]:
        if self._tensors is not None:
            return self._tensors
        found: dict[str, list[tuple[str, Any]]] = {}
        order: list[str] = []
        for shard in self.shard_files:
            for name, t in self._shard_tensors(shard):
                if name not in found:
                    order.append(name)
                found.setdefault(name, []).append((shard, t))
        out: dict[str, Any] = {}
        for name in order:
            hits = found[name]
            want = self.weight_map.get(name)
            shard, t = next(((s, x) for s, x in hits if s == want), hits[0])
            out[name] = t
            self._where[name] = shard
            for s, _x in hits:
                if s != shard:
                    self._dups.append((name, shard, s))
        self._tensors = out
        return out

    def tensor_file(self, name: str) -> str:
        """The shard file that holds tensor ``name``."""
        self._collect()
        try:
            return self._where[name]
        except KeyError:
            raise NotFoundError(f"no tensor named {name!r}", path=self.path) from None

    def _unique(self) -> dict[str, Any]:
        """The tensors, where every name is in one file of the set.

        Raises:
            FormatError: a name is in two files: a loader keeps one of them, silently
                (a folder of unrelated files is no set).
        """
        tensors = self._collect()
        if self._dups:
            name, first, other = self._dups[0]
            more = f" (and {len(self._dups) - 1} more)" if len(self._dups) > 1 else ""
            raise FormatError(
                f"tensor {name!r} is in two files of the set: {first} and {other}{more}",
                path=self.path,
                member=name,
                hint="files that are not one model's shards: open each file by its own path "
                "(`torchless verify` lists every duplicate)",
            )
        return tensors

    # -- Artifact ------------------------------------------------------------------
    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self._unique().items())

    def info(self) -> dict[str, Any]:
        tensors = self._unique()
        out: dict[str, Any] = {"format": self.format, "path": self.path, "serialization": self.serialization, "index": self.index}
        if self.other_indexes:
            out["other_indexes"] = self.other_indexes
        if self.index_data is not None:
            out["index_metadata"] = self.index_data.get("metadata", {})
        out.update(summarize_tensors(tensors.items()))
        per: dict[str, dict[str, Any]] = {s: {"file": s, "tensors": 0, "bytes": 0} for s in self.shard_files}
        for name, t in tensors.items():
            row = per[self._where[name]]
            row["tensors"] += 1
            row["bytes"] += t.nbytes
        out["shards"] = list(per.values())
        out["files"] = len(self.shard_files)
        return out

    def verify(self) -> list[Problem]:
        problems: list[Problem] = []
        try:
            tensors = self._collect()
        except TorchlessError as e:
            return [Problem("shard", str(e))]
        for name, first, other in self._dups:
            problems.append(Problem("duplicate", f"tensor {name!r} is in two shards: {first} and {other}", name))
        if self.index is not None:
            for name, shard in self.weight_map.items():
                if name not in tensors:
                    problems.append(Problem("missing", f"the index maps {name!r} to {shard}, which does not hold it", name))
                elif self._where[name] != shard:
                    problems.append(
                        Problem("misplaced", f"the index maps {name!r} to {shard}; it is in {self._where[name]}", name)
                    )
            for name in tensors:
                if name not in self.weight_map:
                    problems.append(
                        Problem("unlisted", f"shard {self._where[name]} holds {name!r}, which the index does not list", name)
                    )
            meta = (self.index_data or {}).get("metadata", {})
            total = meta.get("total_size")
            if total is not None:
                tensor_bytes = sum(t.nbytes for t in tensors.values())
                storages: dict[Any, int] = {}
                for t in tensors.values():
                    st = getattr(t, "storage", None)
                    if st is not None:
                        storages[st] = st.nbytes
                storage_bytes = sum(storages.values())
                if type(total) is not int or total not in (tensor_bytes, storage_bytes):
                    problems.append(
                        Problem(
                            "total-size",
                            f"metadata.total_size is {short_repr(total, 40)}; the shards hold "
                            f"{tensor_bytes} tensor bytes ({storage_bytes} in distinct storages)",
                            "metadata.total_size",
                        )
                    )
            sets = {(m["stem"], m["ext"]) for m in map(SHARD_RE.match, self.shard_files) if m}
            # (a folder over plain HTTP cannot be listed: no stray-shard check there)
            listed: list[str] | None = [] if self.remote and not remote.listable(self.folder) else None
            if listed is None:
                listed = self.store.list(self.folder)
            for n in sorted(listed):
                m = SHARD_RE.match(n)
                if m and (m["stem"], m["ext"]) in sets and n not in self.shard_files:
                    problems.append(
                        Problem(
                            "stray-shard",
                            f"{n} looks like a shard of this set but the index does not name it",
                            n,
                            None,
                            "warning",
                        )
                    )
        problems += member_problems((shard, self.shard(shard)) for shard in self.shard_files)
        return problems

    def convert_to(
        self,
        dst: Any,
        *,
        format: str,
        progress: Any = None,
        strict: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Stream the tensors into ``dst`` (sharded with ``max_shard_size``; shared
        tensors by the rule of :mod:`..shared`)."""
        from .write import convert_tensors

        dropped = []
        if self.serialization == "bin":
            from ...core.tree import iter_leaves

            for shard in self.shard_files:
                for key, v in iter_leaves(self.shard(shard).load()):
                    dropped.append({"key": key, "type": type(v).__name__ if not hasattr(v, "class_name") else v.class_name})
        return convert_tensors(
            list(self.tensors()),
            dst,
            format=format,
            progress=progress,
            strict=strict,
            dropped=dropped,
            source=self.path,
            options=options,
        )

    def close(self) -> None:
        for art in self._shards.values():
            art.close()
        self._shards.clear()

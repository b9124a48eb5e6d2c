"""Staging areas: where a range job's files are built before they are published.

Files are built under a staging name (a hidden folder beside a local destination, a
``.torchless-staging`` prefix beside a remote one) and published only when all are
complete, the index / ``.metadata`` last. A manifest in the staging area records each
completed file's size and CRC-32 (and, beside a remote destination, a record beside each
finished part object): a resumed job (``resume=True``) verifies and keeps those and runs
only the rest; :func:`cleanup` removes what an interrupted job left, incomplete S3
multipart uploads and Azure blobs of uncommitted blocks included.

* :class:`LocalDirStaging`: a destination folder (DCP), staged as an
  :class:`~torchless.io.atomic.AtomicDir`;
* :class:`LocalFilesStaging`: files beside a local path (safetensors shards), staged in a
  hidden folder and renamed one by one;
* :class:`RemoteStaging`: a URL destination (folder or files beside a path).

Files published beside a path are named by their format: a staging of such files is given
``siblings``, the format's function that aborts the incomplete uploads of those names
(:func:`torchless.formats.hf.ranged.abort_shard_uploads`); this layer knows no format.

Whether the destination is a URL is the caller's answer (it picks the class); only
:func:`cleanup`, an entry point, asks it itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ..io import remote
from ..io.store import LOCAL, store_for
from .plan import OutputFile

__all__ = ["LocalDirStaging", "LocalFilesStaging", "RemoteStaging", "remote_staging_for", "cleanup", "STAGING", "MANIFEST"]

STAGING = ".torchless-staging"
#: a format's abort of the incomplete uploads of the files it publishes beside URL ``dst``
#: (called with ``dst``; returns what it aborted, as :func:`~torchless.io.remote.abort_uploads` does)
Siblings = Callable[[str], list[str]]
MANIFEST = ".torchless-manifest.json"


class _Staging:
    """Where files are built before they are published (see the module doc)."""

    remote = False
    shown_dir = ""  # the output files' folder as the user named it

    def target(self, name: str, offset: int) -> str:
        raise NotImplementedError

    def presize(self, f: OutputFile) -> None:
        pass

    def complete(self, f: OutputFile, segments: list[dict[str, Any]]) -> tuple[list[str], str, list[int]] | None:
        """Finish a file whose segments are all written; or ``(parts, staged URL, sizes)``
        to be joined by a worker (:func:`~torchless.jobs.tasks.compose_parts`)."""
        return None

    def read_manifest(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def write_manifest(self, m: dict[str, Any]) -> None:
        raise NotImplementedError

    def staged_path(self, name: str) -> str:
        raise NotImplementedError

    def drop(self, name: str) -> None:
        pass

    def shown(self, name: str) -> str:
        """Output file ``name`` in the folder the user named (for messages)."""
        d = self.shown_dir
        return remote.join(d, name) if self.remote else os.path.join(d, name)


class LocalDirStaging(_Staging):
    """A hidden folder beside a local destination folder (an :class:`AtomicDir`)."""

    def __init__(self, dst: str, *, resume: bool) -> None:
        from ..io.atomic import AtomicDir, temp_path, untrack

        self.dst = os.path.abspath(dst)
        self.shown_dir = dst
        parent = os.path.dirname(self.dst)
        adopted = _adopt_local(parent, self.dst) if resume else None
        if adopted is not None:  # renamed to a name of this process's before AtomicDir sweeps stale ones
            mine = temp_path(parent, "dir")
            os.rename(adopted, mine)
            adopted = mine
        self.out = AtomicDir(dst, merge=True, store=LOCAL)  # (a local destination, resolved by the job's entry)
        self.root = self.out.tmp
        self.keep = resume
        if resume:  # an interrupted resumable job keeps its staging folder for the next --resume
            untrack(self.out)
        if adopted is not None:
            for n in os.listdir(adopted):
                os.replace(os.path.join(adopted, n), os.path.join(self.root, n))
            import shutil

            shutil.rmtree(adopted, ignore_errors=True)

    def target(self, name: str, offset: int) -> str:
        return os.path.join(self.root, name)

    def staged_path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def presize(self, f: OutputFile) -> None:
        p = os.path.join(self.root, f.name)
        with open(p, "ab") as fh:
            fh.truncate(f.size)

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.root, MANIFEST), "rb") as fh:
                return json.loads(fh.read())
        except (OSError, ValueError):
            return None

    def write_manifest(self, m: dict[str, Any]) -> None:
        tmp = os.path.join(self.root, MANIFEST + ".new")
        with open(tmp, "w") as fh:
            json.dump(m, fh)
        os.replace(tmp, os.path.join(self.root, MANIFEST))

    def put(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.root, name), "wb") as fh:
            fh.write(data)

    def publish(self, last: tuple[str, ...]) -> None:
        try:
            os.unlink(os.path.join(self.root, MANIFEST))
        except OSError:
            pass
        from ..io.atomic import track

        if self.keep:
            track(self.out, self.out.tmp, True)
        self.out.commit(last=last)

    def abort(self, e: BaseException | None = None) -> None:
        if self.keep:
            return
        self.out.abort()
        if e is not None:
            self.out.public(e)


def _adopt_local(parent: str, dst: str) -> str | None:
    """The staging folder an interrupted job (its process gone) left for ``dst``."""
    from ..io.atomic import adoptable

    try:
        names = os.listdir(parent)
    except OSError:
        return None
    for n in sorted(names):
        if not adoptable(n):
            continue
        p = os.path.join(parent, n)
        try:
            with open(os.path.join(p, MANIFEST), "rb") as fh:
                m = json.loads(fh.read())
        except (OSError, ValueError):
            continue
        if m.get("destination") == dst:
            return p
    return None


class RemoteStaging(_Staging):
    """A ``.torchless-staging-<name>`` prefix beside a remote destination: parts, then
    each complete file, then a server-side move into place on publication."""

    remote = True

    def __init__(self, dst: str, *, resume: bool, folder: bool = True, siblings: Siblings | None = None) -> None:
        remote.check_writable(dst)
        self.dst = dst.rstrip("/")
        self.folder = folder  # a destination folder (DCP) or files beside a path (shards)
        self.siblings = siblings  # the format's abort of its files' uploads beside a path
        base = self.dst if folder else remote.dirname(self.dst)
        self.base = self.shown_dir = base
        self.root = remote.join(base, f"{STAGING}-{remote.basename(self.dst)}")
        self.keep = resume
        self.fs, self.inner = remote.filesystem(self.root)
        # a join a killed job left half done is never completed: abort it (S3 keeps, and
        # bills, the parts of an incomplete multipart upload until it is aborted)
        remote.abort_uploads(self.root)
        if not resume:
            self._rm_all()

    def _rm_all(self) -> None:
        try:
            if self.fs.exists(self.inner):
                self.fs.rm(self.inner, recursive=True)
        except Exception:  # noqa: BLE001 - best effort
            pass

    def _record(self, name: str, offset: int) -> str:
        return remote.filesystem(remote.join(self.root, f"done/{name}.{offset:020d}"))[1]

    def record_part(self, r: dict[str, Any]) -> None:
        """Note a finished part (its length and CRC-32s) beside it, so that a resumed job
        keeps it: one small object per part, written after the part object exists (an
        object store creates it whole or not at all)."""
        rec = {k: r[k] for k in ("name", "offset", "length", "crc", "items")}
        self.fs.pipe_file(self._record(r["name"], r["offset"]), json.dumps(rec).encode())

    def recorded_parts(self) -> dict[tuple[str, int], dict[str, Any]]:
        """The finished parts of an interrupted run: each recorded, and its part object
        still there with the recorded length."""
        try:
            sizes = {
                str(e["name"]).rsplit("/", 1)[-1]: int(e.get("size") or 0)
                for e in self.fs.ls(remote.filesystem(remote.join(self.root, "parts"))[1], detail=True)
            }
            recs = self.fs.cat([str(e) for e in self.fs.ls(remote.filesystem(remote.join(self.root, "done"))[1], detail=False)])
        except FileNotFoundError:
            return {}
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for data in recs.values():
            try:
                r = json.loads(data)
                key = (str(r["name"]), int(r["offset"]))
                length = int(r["length"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn record (a store without atomic puts): the part is written again
            if sizes.get(f"{key[0]}.{key[1]:020d}") == length:
                out[key] = r
        return out

    def clear_parts(self) -> None:
        """Forget the parts of an earlier, different job in this staging."""
        for sub in ("parts", "done"):
            try:
                self.fs.rm(remote.filesystem(remote.join(self.root, sub))[1], recursive=True)
            except Exception:  # noqa: BLE001 - none there
                pass

    def target(self, name: str, offset: int) -> str:
        return remote.join(self.root, f"parts/{name}.{offset:020d}")

    def staged_path(self, name: str) -> str:
        return remote.join(self.root, f"files/{name}")

    def complete(self, f: OutputFile, segments: list[dict[str, Any]]) -> tuple[list[str], str, list[int]] | None:
        """Join the file's part objects into one staged object: a server-side move (one
        part) or a server-side join (:func:`~torchless.io.remote.join_objects`) when no
        payload byte would pass through this process (on S3: every part but the last has
        S3's 5 MiB minimum; on Azure: the parts' URLs can be authorized); otherwise
        ``(parts, staged URL, sizes)``, joined by a worker (:func:`~torchless.jobs.tasks.compose_parts`), so no
        payload byte passes through the coordinator."""
        segs = sorted(segments, key=lambda s: s["offset"])
        if not segs:  # an empty file
            self.put(f.name, b"")
            return None
        parts = [self.target(f.name, s["offset"]) for s in segs]
        sizes = [s["length"] for s in segs]
        if len(parts) == 1:
            remote.move(parts[0], self.staged_path(f.name))
            return None
        if remote.joins_server_side(self.root, sizes):
            from ..io.atomic import holding_signals

            with holding_signals():  # a Ctrl-C lands once the upload is completed or aborted
                remote.join_objects(self.staged_path(f.name), parts, sizes)
            self.fs.rm([remote.filesystem(p)[1] for p in parts])
            return None
        return parts, self.staged_path(f.name), sizes

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads(remote.read_bytes(remote.join(self.root, "manifest.json")))
        except Exception:  # noqa: BLE001 - none, or unreadable: start afresh
            return None

    def write_manifest(self, m: dict[str, Any]) -> None:
        # one put: an object store creates it whole; a torn manifest elsewhere does not
        # parse, and the next --resume starts afresh
        self.fs.pipe_file(remote.filesystem(remote.join(self.root, "manifest.json"))[1], json.dumps(m).encode())

    def put(self, name: str, data: bytes) -> None:
        from ..io.atomic import atomic_write_bytes

        atomic_write_bytes(self.staged_path(name), data)

    def drop(self, name: str) -> None:
        remote.remove(self.staged_path(name))

    def publish(self, last: tuple[str, ...]) -> None:
        """Move every staged file into place, those named in ``last`` after all others."""
        from ..io.atomic import holding_signals

        names = sorted(remote.listdir(remote.join(self.root, "files")), key=lambda n: (n in last, n))

        def move(n: str) -> None:  # on Azure: waited for until the service's copy is complete
            remote.move(self.staged_path(n), remote.join(self.base, n))

        for n in names:
            if n not in last:
                move(n)
        with holding_signals():  # the index / .metadata: published whole, or not at all
            for n in names:
                if n in last:
                    move(n)
        self._rm_all()

    def abort(self, e: BaseException | None = None) -> None:
        if not self.keep:
            # the staging objects, and the uploads left incomplete (S3's multipart parts,
            # Azure's uncommitted blocks) in the staging and at the destination
            try:
                cleanup(self.dst, folder=self.folder, siblings=self.siblings)
            except Exception:  # noqa: BLE001 - best effort: the job's own error is raised
                self._rm_all()


def remote_staging_for(dst: str, *, folder: bool = True) -> bool:
    """True when URL ``dst`` has the staging of an interrupted job for it (its manifest
    names ``dst``): a ``--resume`` picks it up, and overwrites any of its files that job
    had already moved into place."""
    d = dst.rstrip("/")
    base = d if folder else remote.dirname(d)
    root = remote.join(base, f"{STAGING}-{remote.basename(d)}")
    try:
        m = json.loads(remote.read_bytes(remote.join(root, "manifest.json")))
    except Exception:  # noqa: BLE001 - none, or unreadable
        return False
    return isinstance(m, dict) and m.get("destination") == d


def cleanup(dst: Any, *, folder: bool = True, siblings: Siblings | None = None) -> list[str]:
    """Remove what interrupted jobs left for destination ``dst`` (their staging folders
    or prefixes, never a published file; on S3 also the incomplete multipart uploads,
    on Azure the blobs of uncommitted blocks, under the staging prefix and at the
    destination). Returns what was removed: local staging folders; at a URL each object,
    and ``URL (incomplete multipart upload)`` / ``URL (uncommitted blocks)``. (The public
    :func:`torchless.dcp.cleanup` is :func:`torchless.formats.hf.ranged.cleanup`: this
    with the shard names.)

    Args:
        dst: the destination the job wrote: a DCP folder (``folder=True``) or a file
            (files are staged beside it: ``folder=False``); a path or a URL.
        siblings: with ``folder=False`` at a URL, the format's abort of the incomplete
            uploads of the files published beside ``dst`` (returns what it aborted).
    """
    d = remote.local_path(os.fspath(dst))
    removed: list[str] = []
    if store_for(d).remote:
        d = d.rstrip("/")
        base = d if folder else remote.dirname(d)
        root = remote.join(base, f"{STAGING}-{remote.basename(d)}")
        fs, inner = remote.filesystem(root)
        scheme = d.partition("://")[0]
        try:
            objects = sorted(str(p) for p in fs.find(inner))
        except FileNotFoundError:
            objects = []
        if objects:
            fs.rm(objects)
            removed += [f"{scheme}://{p}" for p in objects]
        try:
            if fs.exists(inner):  # a folder marker some stores keep
                fs.rm(inner, recursive=True)
        except (FileNotFoundError, OSError):
            pass
        remote.forget(root)
        # uploads a killed process left incomplete: its joins in the staging, and its
        # single-object uploads (a file, or a move of a file over 5 GiB) at the destination
        removed += remote.abort_uploads(d if folder else root)
        if not folder:
            removed += remote.abort_uploads(d, exact=True)
            if siblings is not None:
                removed += siblings(d)
        return removed
    import shutil

    d = os.path.abspath(d)
    while True:
        p = _adopt_local(os.path.dirname(d), d)
        if p is None:
            break
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


# -- files beside a local path (sharded safetensors: consolidate, convert) -------------------------
class LocalFilesStaging(LocalDirStaging):
    """A hidden folder inside the destination's folder; published by renaming each file
    into that folder, the index last (the folder itself is not replaced)."""

    def __init__(self, dst: str, *, resume: bool) -> None:
        from ..io.atomic import clean_stale, temp_path, track

        self.dst = os.path.abspath(dst)
        self.shown_dir = os.path.dirname(dst)
        self.folder = os.path.dirname(self.dst)
        adopted = _adopt_local(self.folder, self.dst) if resume else None
        self.root = temp_path(self.folder, "dir")
        if adopted is not None:  # renamed to this process's name before stale ones are swept
            os.rename(adopted, self.root)
        else:
            os.mkdir(self.root, 0o777)
        clean_stale(self.folder)
        self.keep = resume
        self.out = self  # type: ignore[assignment]  # this staging publishes its files itself (no AtomicDir)
        if not resume:
            track(self, self.root, True)

    def publish(self, last: tuple[str, ...]) -> None:
        import shutil

        from ..io.atomic import holding_signals, untrack

        try:
            os.unlink(os.path.join(self.root, MANIFEST))
        except OSError:
            pass
        with holding_signals():
            for n in sorted(os.listdir(self.root), key=lambda n: (n in last, n)):
                os.replace(os.path.join(self.root, n), os.path.join(self.folder, n))
            shutil.rmtree(self.root, ignore_errors=True)
            untrack(self)

    def abort(self, e: BaseException | None = None) -> None:
        import shutil

        from ..io.atomic import untrack

        if self.keep:
            return
        shutil.rmtree(self.root, ignore_errors=True)
        untrack(self)

"""Writes the inputs of the scanner's determinism and work-budget tests (no torch needed).

    python determinism_samples.py OUT_DIR

* ``shared_args(calls, payload)``: the red team's shape (issue 30, item 4): a DAG of
  memoized tuples, each level 64 references to the one below (64**3 leaves if walked as a
  tree, 4 tuples in memory), passed by BINGET to ``calls`` REDUCE calls of
  ``collections.OrderedDict``; ``payload`` appends an ``os.system`` call. A scanner that
  walks each call's arguments as a tree does 266,305 steps per call.
* ``shared_mutable_args``: the same with 64 x 64 distinct lists and an APPEND between
  calls (every search is stale): it must run out of the argument-node budget, not hang.
* ``dcp_folder(out)``: a DCP folder as the scanner reads it: a ``.metadata`` pickle of
  ``_StorageInfo`` records and three item files; ``__0_0.distcp`` holds 26 items, torch
  zips of one layout (``torchless.save``) and small shared-argument pickles alternately
  (``dcp.load`` torch.loads each slice).
* ``small_formats(out)``: npz (an object array: a pickle inside), joblib, safetensors and a
  plain pickle, written by their own libraries.
"""

from __future__ import annotations

import os
import struct
import sys

OD = b"ccollections\nOrderedDict\n"


def _put(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)


def _get(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)


def _payload() -> bytes:
    return b"cos\nsystem\nX\x04\x00\x00\x00true\x85R0"


def shared_args(calls: int, payload: bool = False) -> bytes:
    """Protocol-2 pickle: a 4-level DAG of shared tuples passed to ``calls`` calls."""
    b = b"\x80\x02(" + b"K\x01" * 64 + b"t" + _put(0)
    for lvl in range(1, 4):
        b += b"(" + _get(lvl - 1) * 64 + b"t" + _put(lvl)
    b += b"0" + OD + _put(10) + b"0]" + _put(11) + b"0"
    for _ in range(calls):
        b += _get(11) + _get(10) + _get(3) + b"\x85Ra0"  # result.append(OrderedDict((shared,)))
    if payload:
        b += _payload()
    return b + b"N."


def shared_mutable_args(calls: int, payload: bool = False) -> bytes:
    """64 leaf lists, 64 distinct lists of them, one list of those; an APPEND between calls."""
    b = b"\x80\x02"
    for i in range(64):
        b += b"(" + b"K\x01" * 64 + b"l" + b"q" + bytes([i]) + b"0"
    for j in range(64):
        b += b"(" + b"".join(b"h" + bytes([i]) for i in range(64)) + b"l" + b"q" + bytes([64 + j]) + b"0"
    b += b"(" + b"".join(b"h" + bytes([64 + j]) for j in range(64)) + b"l" + b"q\xc8" + b"0"
    b += OD + b"q\xc9" + b"0]q\xca0"
    for _ in range(calls):
        b += b"h\xcah\xc9h\xc8\x85Ra0"
    if payload:
        b += _payload()
    return b + b"N."


def _storage_info(rel: str, off: int, ln: int) -> bytes:
    def s(x: str) -> bytes:
        e = x.encode()
        return b"X" + struct.pack("<I", len(e)) + e

    return (
        b"ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n)\x81}("
        + s("relative_path")
        + s(rel)
        + s("offset")
        + b"J"
        + struct.pack("<i", off)
        + s("length")
        + b"J"
        + struct.pack("<i", ln)
        + b"ub"
    )


def torch_zip(i: int) -> bytes:
    """A torch zip checkpoint (torchless's writer: torch 2.13's layout) of one 4-element
    tensor: every ``i`` gives the same layout (members at the same offsets and sizes)."""
    import io

    import numpy as np

    import torchless

    buf = io.BytesIO()
    torchless.save({"w": np.full(4, i, dtype=np.float32)}, buf)
    return buf.getvalue()


def dcp_folder(out: str, items: int = 26, calls: int = 24) -> str:
    """A DCP folder: ``.metadata`` and three item files (26, 2 and 1 items); the items
    alternate between torch zips of one layout and shared-argument pickles."""
    os.makedirs(out, exist_ok=True)
    recs = []
    for name, n in (("__0_0.distcp", items), ("__1_0.distcp", 2), ("__2_0.distcp", 1)):
        blob = b""
        for i in range(n):
            item = torch_zip(i) if i % 2 == 0 else shared_args(calls + i)
            recs.append(_storage_info(name, len(blob), len(item)))
            blob += item
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(out, ".metadata"), "wb") as f:
        f.write(b"\x80\x02(" + b"".join(recs) + b"l.")
    return out


def small_formats(out: str) -> list[str]:
    """npz (an object array), joblib, safetensors and a plain pickle; their paths."""
    import pickle

    import joblib
    import numpy as np
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    paths = []
    p = os.path.join(out, "arrays.npz")
    np.savez(p, a=np.arange(12, dtype=np.float32).reshape(3, 4), o=np.array([{"k": 1}, None], dtype=object))
    paths.append(p)
    p = os.path.join(out, "model.joblib")
    joblib.dump({"w": np.ones((4, 3)), "names": ["a", "b"]}, p)
    paths.append(p)
    p = os.path.join(out, "weights.safetensors")
    save_file({"w": np.ones((2, 3), dtype=np.float32), "b": np.zeros(3, dtype=np.int64)}, p)
    paths.append(p)
    p = os.path.join(out, "data.pkl")
    with open(p, "wb") as f:
        pickle.dump({"x": [1, 2.5, "s"], "y": (b"\x00" * 8, None)}, f, protocol=4)
    paths.append(p)
    return paths


if __name__ == "__main__":
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for name, data in (
        ("shared_args.pkl", shared_args(1000)),
        ("shared_args_payload.pkl", shared_args(1000, payload=True)),
        ("shared_mutable_args.pkl", shared_mutable_args(1000, payload=True)),
    ):
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    dcp_folder(os.path.join(root, "dcp"))
    small_formats(os.path.join(root, "formats"))

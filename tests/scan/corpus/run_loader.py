"""Load corpus samples the way their victims would, each in a forked child with a timeout.

Usage: ``python run_loader.py TIMEOUT LOADER=PATH...``; prints one JSON line per sample
(``{"path", "status"}``, status ``done``, ``raised``, ``timeout`` or ``crashed``). The
marker directory comes from ``TORCHLESS_SCAN_MARKER_DIR``. Test helper only: this *runs*
the malicious samples (their payloads just create marker files).
"""

from __future__ import annotations

import json
import os
import sys
import time


def load(loader: str, path: str) -> None:
    import pickle

    if loader == "pickle":
        with open(path, "rb") as f:
            pickle.load(f)
    elif loader == "gzip":
        import gzip

        with gzip.open(path) as f:
            pickle.load(f)
    elif loader == "bz2":
        import bz2

        with bz2.open(path) as f:
            pickle.load(f)
    elif loader in ("xz", "lzma"):
        import lzma

        with lzma.open(path) as f:
            pickle.load(f)
    elif loader == "zlib":
        import zlib

        with open(path, "rb") as f:
            pickle.loads(zlib.decompress(f.read()))
    elif loader == "joblib":
        import joblib

        joblib.load(path)
    elif loader == "numpy":
        import numpy as np

        r = np.load(path, allow_pickle=True)
        if hasattr(r, "files"):
            for k in r.files:
                r[k]
    elif loader == "torch":
        import torch

        torch.load(path, weights_only=False)
    elif loader == "jit":
        import torch

        torch.jit.load(path)
    elif loader == "export":
        import torch

        torch.export.load(path)
    elif loader == "dcp":
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        md = dcp.FileSystemReader(path).read_metadata()  # plain pickle.load of .metadata
        state = {
            k: (torch.zeros(v.size) if isinstance(v, TensorStorageMetadata) else None) for k, v in md.state_dict_metadata.items()
        }
        dcp.load(state, checkpoint_id=path, no_dist=True)
    else:
        raise SystemExit(f"unknown loader {loader}")


def main(argv: list[str]) -> int:
    timeout = float(argv[0])
    jobs = [a.split("=", 1) for a in argv[1:]]
    if any(loader in ("torch", "jit", "export", "dcp") for loader, _p in jobs):
        import warnings

        import torch  # noqa: F401  (import once, before forking)
        import torch.distributed.checkpoint  # noqa: F401
        import torch.export  # noqa: F401

        try:
            import torch._export.serde.serialize  # noqa: F401  (the heavy part of export.load)
        except ImportError:
            pass

        warnings.simplefilter("ignore")
    for loader, p in jobs:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sys.stdout = sys.stderr = open(os.devnull, "w")
                load(loader, p)
            except BaseException:  # the payload ran (or not); loaders often fail after it
                code = 3
            os._exit(code)
        deadline = time.monotonic() + timeout
        status = "timeout"
        while time.monotonic() < deadline:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = {0: "done", 3: "raised"}.get(os.waitstatus_to_exitcode(st), "crashed")
                break
            time.sleep(0.005)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        print(
            json.dumps(
                {"path": p, "loader": loader, "status": status, "seconds": round(time.monotonic() - deadline + timeout, 3)}
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Load regression samples with their real loaders, in forked children, several at a time.

Usage: ``python run_regression.py OUT_DIR MARKER_DIR [--timeout S] [--jobs N] [NAME...]``

Reads ``OUT_DIR/manifest.json`` (written by ``gen_regression.py``), imports torch once
if any sample needs it, then forks one child per sample (``--jobs`` at a time). Each
child runs with ``MARKER_DIR`` as its working directory and ``TORCHLESS_SCAN_MARKER_DIR``
set, silences stdout/stderr and calls the loader. Prints one JSON line per sample:
``{"name", "status": done|raised|timeout|crashed, "error", "seconds"}``.

Test helper only: this *runs* the samples (their payloads only create marker files).
The loaders of ``run_loader.py`` are reused; this adds ``joblib``, ``lite``
(``torch.jit.mobile._load_for_lite_interpreter``), ``aoti`` (``aoti_load_package``),
``compile`` (a ``torch.compile`` cache hit on the Inductor cache folder the sample is;
``python run_regression.py --fill-cache DIR`` fills such a folder)
and ``dcp-dir`` (DCP with the state built from the metadata, as ``run_loader``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
ENV = "TORCHLESS_SCAN_MARKER_DIR"
TORCH_LOADERS = {"torch", "jit", "lite", "export", "dcp", "aoti", "compile"}


def _run_loader() -> Any:
    spec = importlib.util.spec_from_file_location("tl_run_loader", os.path.join(_HERE, "run_loader.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def compile_target() -> Any:
    """The function whose compiled form the Inductor-cache samples hold (same source in
    the process that fills the cache and in the one that hits it)."""
    import torch

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, x)  # an extern kernel only: no C++ kernel to build

    return torch.compile(f)


def compile_hit(cache_dir: str) -> None:
    """Call the compiled target with ``cache_dir`` as the Inductor cache."""
    import torch

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    fn = compile_target()
    fn(torch.arange(4, dtype=torch.float32).reshape(2, 2))


def load(loader: str, path: str) -> None:
    """Open ``path`` the way ``loader`` does (see the module docstring)."""
    if loader == "joblib":
        import joblib

        joblib.load(path)
    elif loader == "lite":
        import torch.jit.mobile

        torch.jit.mobile._load_for_lite_interpreter(path)
    elif loader == "aoti":
        import torch._inductor

        torch._inductor.aoti_load_package(path)
    elif loader == "compile":
        compile_hit(path)
    elif loader == "pickle-loads":
        import pickle

        with open(path, "rb") as f:
            pickle.loads(f.read())
    else:
        _run_loader().load(loader, path)


def _prewarm(loaders: set[str]) -> None:
    import warnings

    warnings.simplefilter("ignore")
    if loaders & TORCH_LOADERS:
        import torch  # noqa: F401  (once, before forking)
        import torch.distributed.checkpoint  # noqa: F401
        import torch.export  # noqa: F401

        try:
            import torch._export.serde.serialize  # noqa: F401
        except ImportError:
            pass
    if "compile" in loaders or "aoti" in loaders:
        import torch._dynamo  # noqa: F401
        import torch._inductor.codecache  # noqa: F401
    if "joblib" in loaders:
        import joblib  # noqa: F401
    import numpy  # noqa: F401


def _child(loader: str, path: str, marker_dir: str, err_file: str) -> None:
    code = 0
    try:
        os.chdir(marker_dir)
        os.environ[ENV] = marker_dir
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        load(loader, path)
    except BaseException as e:  # the payload ran (or not); loaders often fail after it
        code = 3
        try:
            with open(err_file, "w") as f:
                f.write(f"{type(e).__name__}: {str(e)[:300]}")
        except OSError:
            pass
    os._exit(code)


def run(
    samples: list[dict[str, Any]], out_dir: str, marker_dir: str, *, timeout: float = 60, jobs: int = 2
) -> list[dict[str, Any]]:
    """Load every sample; returns one result dict per sample (in input order)."""
    _prewarm({s["loader"] for s in samples})
    errdir = tempfile.mkdtemp(prefix="regr-err-")
    pending = list(enumerate(samples))
    running: dict[int, tuple[int, float, dict[str, Any]]] = {}
    results: dict[int, dict[str, Any]] = {}
    while pending or running:
        while pending and len(running) < jobs:
            i, s = pending.pop(0)
            err = os.path.join(errdir, str(i))
            pid = os.fork()
            if pid == 0:
                _child(s["loader"], os.path.join(out_dir, s["load"]), marker_dir, err)
            running[pid] = (i, time.monotonic(), s)
        time.sleep(0.01)
        for pid, (i, t0, s) in list(running.items()):
            done, st = os.waitpid(pid, os.WNOHANG)
            status = None
            if done:
                status = {0: "done", 3: "raised"}.get(os.waitstatus_to_exitcode(st), "crashed")
            elif time.monotonic() - t0 > timeout:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                status = "timeout"
            if status is None:
                continue
            del running[pid]
            err = os.path.join(errdir, str(i))
            msg = ""
            if os.path.exists(err):
                with open(err) as f:
                    msg = f.read()
            results[i] = {
                "name": s["name"],
                "loader": s["loader"],
                "status": status,
                "error": msg,
                "seconds": round(time.monotonic() - t0, 2),
            }
    return [results[i] for i in range(len(samples))]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--fill-cache"]:
        compile_hit(os.path.abspath(argv[1]))
        return 0
    out_dir, marker_dir = os.path.abspath(argv[0]), os.path.abspath(argv[1])
    rest = argv[2:]
    timeout, jobs = 60.0, 2
    names: list[str] = []
    while rest:
        a = rest.pop(0)
        if a == "--timeout":
            timeout = float(rest.pop(0))
        elif a == "--jobs":
            jobs = int(rest.pop(0))
        else:
            names.append(a)
    with open(os.path.join(out_dir, "manifest.json")) as f:
        man = json.load(f)["samples"]
    if names:
        man = [s for s in man if s["name"] in names]
    for r in run(man, out_dir, marker_dir, timeout=timeout, jobs=jobs):
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Load the review-3 samples with their real loaders, one forked child per sample.

Usage: ``python run_review3_source.py OUT_DIR MARKER_DIR [--timeout S] [--jobs N]``

Reads ``OUT_DIR/manifest.json`` (``gen_review3_source.py``), imports torch and
transformers once (with ``HF_HUB_OFFLINE=1`` and a private ``HF_MODULES_CACHE``), then forks
one child per sample (``--jobs`` at a time) with ``MARKER_DIR`` as its working directory and
``TORCHLESS_SCAN_MARKER_DIR`` set. Prints one JSON line per sample: ``{"name", "status":
done|raised|timeout|crashed|skipped, "error"}``.

Loaders: ``package-pickle|text|binary`` (``PackageImporter(f).load_pickle/load_text/
load_binary(package, resource)`` with ``arg`` = ``package/.../resource``),
``package-module`` (``import_module(arg)``), ``hf-config`` / ``hf-model`` /
``hf-tokenizer`` / ``hf-feature-extractor`` (``AutoConfig`` / ``AutoModel`` /
``AutoTokenizer`` / ``AutoFeatureExtractor.from_pretrained(folder, trust_remote_code=True)``),
``hf-hub-config`` (``AutoConfig.from_pretrained(arg, cache_dir=folder)``: a repo id read from
a Hub cache) and ``hf-pipeline`` (``pipeline(arg, model=folder, trust_remote_code=True)``).

Test helper only: this *runs* the samples (their payloads only create marker files).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

ENV = "TORCHLESS_SCAN_MARKER_DIR"


def load(loader: str, path: str, arg: str) -> None:
    if loader.startswith("package-"):
        from torch.package import PackageImporter

        imp = PackageImporter(path)
        if loader == "package-module":
            imp.import_module(arg)
            return
        pkg, res = arg.rsplit("/", 1)
        getattr(imp, {"package-pickle": "load_pickle", "package-text": "load_text", "package-binary": "load_binary"}[loader])(
            pkg.replace("/", "."), res
        )
        return
    import transformers

    kw: dict[str, Any] = {"trust_remote_code": True}
    if loader == "hf-hub-config":
        transformers.AutoConfig.from_pretrained(arg, cache_dir=path, local_files_only=True, **kw)
    elif loader == "hf-pipeline":
        transformers.pipeline(arg, model=path, **kw)
    else:
        cls = {
            "hf-config": "AutoConfig",
            "hf-model": "AutoModel",
            "hf-tokenizer": "AutoTokenizer",
            "hf-feature-extractor": "AutoFeatureExtractor",
        }[loader]
        getattr(transformers, cls).from_pretrained(path, **kw)


def main(argv: list[str]) -> int:
    out, markers = os.path.abspath(argv[0]), os.path.abspath(argv[1])
    timeout = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else 120.0
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 2
    with open(os.path.join(out, "manifest.json")) as f:
        man = json.load(f)
    entries = man["samples"] + man["controls"]
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="tl-hfmods-"))
    os.environ[ENV] = markers
    have_hf = True
    try:
        import transformers  # noqa: F401  (imported once, before the forks)
    except ImportError:
        have_hf = False
    if any(e["loader"].startswith("package-") for e in entries):
        import torch.package  # noqa: F401
    pending = list(entries)
    running: dict[int, tuple[str, int, float]] = {}
    while pending or running:
        while pending and len(running) < jobs:
            e = pending.pop(0)
            if e["loader"].startswith("hf-") and not have_hf:
                print(json.dumps({"name": e["name"], "status": "skipped", "error": "transformers is not installed"}), flush=True)
                continue
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: load, report, exit
                os.close(r)
                os.chdir(markers)
                fd = os.open(os.devnull, os.O_WRONLY)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                try:
                    load(e["loader"], os.path.join(out, e["load"]), e.get("arg", ""))
                    msg = ""
                except BaseException as ex:  # the loader raising after the payload is a result too
                    msg = f"{type(ex).__name__}: {str(ex)[:300]}"
                os.write(w, msg.encode() or b"-")
                os._exit(0)
            os.close(w)
            running[pid] = (e["name"], r, time.monotonic())
        time.sleep(0.02)
        for pid, (name, r, t0) in list(running.items()):
            done, st = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() - t0 > timeout:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                res = {"name": name, "status": "timeout", "error": f"ran past {timeout:.0f} s"}
            elif done:
                msg = os.read(r, 4096).decode(errors="replace")
                if not msg:
                    res = {"name": name, "status": "crashed", "error": f"wait status {st}"}
                else:
                    res = {"name": name, "status": "done" if msg == "-" else "raised", "error": "" if msg == "-" else msg}
            else:
                continue
            os.close(r)
            del running[pid]
            print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

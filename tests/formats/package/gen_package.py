"""Writes torch.package archives for the tests (run in a child process: it imports torch
and the packaged modules it creates).

    python gen_package.py OUTDIR MARKER

benign.pt: an interned module ``mypkg.model`` (class Net, an nn.Module with a Linear and
a buffer), numpy mocked, torch extern; pickles ``model/model.pkl`` (the module) and
``res/sd.pkl`` (a dict with a bfloat16 tensor); a text resource.
evil_source.pt: ``evil.payload`` whose module body writes MARKER; its pickle names
``evil.payload.Thing``, so PackageImporter.load_pickle runs the module.
evil_pickle.pt: a pickle that reduces to ``posix.system`` (extern) writing MARKER.
"""

from __future__ import annotations

import os
import sys


def main(out: str, marker: str) -> None:
    src = os.path.join(out, "src")
    os.makedirs(os.path.join(src, "mypkg"), exist_ok=True)
    os.makedirs(os.path.join(src, "evil"), exist_ok=True)
    with open(os.path.join(src, "mypkg", "__init__.py"), "w"):
        pass
    with open(os.path.join(src, "mypkg", "model.py"), "w") as f:
        f.write(
            "import torch\nimport numpy\n\n"
            "class Net(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.l = torch.nn.Linear(3, 2)\n"
            "        self.register_buffer('buf', torch.arange(4))\n"
        )
    with open(os.path.join(src, "evil", "__init__.py"), "w"):
        pass
    with open(os.path.join(src, "evil", "payload.py"), "w") as f:
        f.write(f"open({marker!r}, 'w').write('ran')\n\nclass Thing:\n    pass\n")
    sys.path.insert(0, src)
    import torch
    from mypkg.model import Net
    from torch.package import PackageExporter

    torch.manual_seed(0)
    with PackageExporter(os.path.join(out, "benign.pt")) as pe:
        pe.intern("mypkg.**")
        pe.extern("torch.**")
        pe.mock("numpy.**")
        pe.save_pickle("model", "model.pkl", Net())
        pe.save_pickle("res", "sd.pkl", {"w": torch.linspace(-1, 1, 6).reshape(2, 3).to(torch.bfloat16), "x": [1, 2]})
        pe.save_text("res", "note.txt", "hello")
    # the module body only runs when imported: the exporter needs the class, so it is
    # imported here with the marker pointed elsewhere, then the marker is removed
    import evil.payload

    if os.path.exists(marker):
        os.remove(marker)
    with PackageExporter(os.path.join(out, "evil_source.pt")) as pe:
        pe.intern("evil.**")
        pe.save_pickle("m", "obj.pkl", evil.payload.Thing())

    class Boom:
        def __reduce__(self):
            return (os.system, (f"echo ran > {marker}",))

    with PackageExporter(os.path.join(out, "evil_pickle.pt")) as pe:
        pe.extern(["posix", "os"])
        pe.save_pickle("m", "obj.pkl", Boom())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

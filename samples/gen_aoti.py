# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Regenerate ``samples/mlp_aoti.pt2`` (run: python samples/gen_aoti.py; needs g++).

An AOTInductor package of a small MLP with a bfloat16 and an int64 buffer, built with
``aot_inductor.package_cpp_only=True`` so the sample stays small (~50 KB): generated C++
sources, metadata, CMake files and the ``<hash>.weights.o`` object file that holds the
weights (a default build adds a ~1.5 MB ``wrapper.so`` with the same weights linked in).
The demo lists it, reads its weights from the object file and unpacks it, without torch.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 16)
        self.l2 = torch.nn.Linear(16, 2)
        self.register_buffer("scale", (torch.arange(16) / 7).to(torch.bfloat16))
        self.register_buffer("offset", torch.arange(12, dtype=torch.int64).reshape(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x)) * self.scale.float()
        return self.l2(h) + self.offset.float().mean()


def scrub(path: str, replacements: dict[str, str]) -> None:
    """Replace build-machine paths in the package's text records (compile commands, flag
    JSON, CMake files) with placeholders, and rewrite the archive with torchless's writer
    (torch's record layout); binaries are copied unchanged."""
    from torchless.container.zip import TorchZipWriter, ZipReader

    zr = ZipReader(path)
    tmp = path + ".scrubbed"
    w = TorchZipWriter(tmp, prefix=zr.prefix)
    for rec in zr.records():
        data = zr.read_bytes(rec)
        if rec.endswith((".cpp", ".h", ".json", ".txt", ".ld")):
            text = data.decode("utf-8")
            for old, new in sorted(replacements.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(old, new)
            data = text.encode("utf-8")
        w.write(rec, data)
    w.close()
    zr.close()
    os.replace(tmp, path)


def main() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    ep = torch.export.export(model, (torch.randn(3, 4),))
    out = os.path.join(HERE, "mlp_aoti.pt2")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # keep the user's cache clean
        torch._inductor.aoti_compile_and_package(ep, package_path=out, inductor_configs={"aot_inductor.package_cpp_only": True})
        scrub(
            out,
            {
                cache: "<cache>",
                os.path.dirname(os.path.dirname(torch.__file__)): "<site-packages>",
                sys.prefix: "<prefix>",
                sys.base_prefix: "<python>",
                os.path.expanduser("~"): "<home>",
                tempfile.gettempdir(): "<tmp>",
            },
        )


if __name__ == "__main__":
    main()

"""Build the AOTInductor packages the tests inspect (run as a script, needs torch + a C++ compiler).

    python gen_packages.py OUTDIR

Writes into OUTDIR (a fresh TORCHINDUCTOR_CACHE_DIR must be set by the caller):

* ``embedded.pt2``  default options: a real ``wrapper.so`` with the weights linked in
* ``object.pt2``    ``package_cpp_only``: sources + ``<hash>.weights.o`` (weights inside)
* ``blob.pt2``      ``package_cpp_only`` + ``binary_blob``: ``<wrapper>_weights.blob``
* ``pickle.pt2``    ``package_cpp_only`` + ``pickle_weights``: ``data/weights/weight_<i>``
* ``mmap.pt2``      ``package_cpp_only`` + ``force_mmap_weights``: ``_serialized_weights.bin``
* ``export.pt2``    ``torch.export.save`` of the same program (no AOTInductor output)
* ``sd.pt``         the model's ``state_dict()`` (the oracle)
* ``status.json``   variant -> "ok" or the error text

Only ``embedded`` builds a shared object (~1 minute on 2 cores); the ``package_cpp_only``
variants only generate code (seconds), which is all torchless needs to read their weights.
"""

import json
import os
import sys
import time

import torch


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 16)  # 16-element bias: kept as a constant
        self.l2 = torch.nn.Linear(16, 2)  # 2-element bias: inlined into the kernel source
        self.register_buffer("scale", (torch.arange(16) / 7).to(torch.bfloat16))
        self.register_buffer("offset", torch.arange(12, dtype=torch.int64).reshape(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x)) * self.scale.float()
        return self.l2(h) + self.offset.float().mean()


VARIANTS = {
    "object": {"aot_inductor.package_cpp_only": True},
    "blob": {
        "aot_inductor.package_cpp_only": True,
        "aot_inductor.package_constants_in_so": False,
        "aot_inductor.package_constants_on_disk_format": "binary_blob",
    },
    "pickle": {
        "aot_inductor.package_cpp_only": True,
        "aot_inductor.package_constants_in_so": False,
        "aot_inductor.package_constants_on_disk_format": "pickle_weights",
    },
    "mmap": {"aot_inductor.package_cpp_only": True, "aot_inductor.force_mmap_weights": True},
    "embedded": {},
}


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    m = Model().eval()
    ep = torch.export.export(m, (torch.randn(3, 4),))
    torch.save(m.state_dict(), os.path.join(out, "sd.pt"))
    torch.export.save(ep, os.path.join(out, "export.pt2"))
    status = {}
    only = os.environ.get("TORCHLESS_AOTI_VARIANTS")
    for name, cfg in VARIANTS.items():
        if only and name not in only.split(","):
            continue
        t = time.time()
        try:
            torch._inductor.aoti_compile_and_package(
                ep, package_path=os.path.join(out, f"{name}.pt2"), inductor_configs=dict(cfg)
            )
            status[name] = "ok"
        except Exception as e:  # recorded, the test for that variant skips with it
            status[name] = f"{type(e).__name__}: {e}"[:2000]
        print(f"{name}: {status[name][:80]} ({time.time() - t:.1f}s)", flush=True)
    with open(os.path.join(out, "status.json"), "w") as f:
        json.dump(status, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

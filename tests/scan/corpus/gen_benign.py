"""Generate the benign scan corpus: artifacts people legitimately save (needs torch).

Usage: ``python gen_benign.py OUT_DIR``

Writes torch checkpoints (state dicts, optimizer state, configs, NumPy values, slices,
sets, every storage generation, legacy stream format, protocol 4, CRC-less), TorchScript
(scripted, traced, lite), ``.pt2``, a DCP directory, ``.npy``/``.npz`` and plain pickles of
builtin data, plus ``OUT_DIR/manifest.json``. ``torchless scan`` must call all of them
clean.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import io
import json
import os
import pathlib
import pickle
import sys
import zipfile


def main(argv: list[str]) -> int:
    import numpy as np
    import torch

    out = argv[0]
    os.makedirs(out, exist_ok=True)
    man: list[dict] = []
    torch.manual_seed(0)

    def save(name: str, obj: object, what: str, **kw: object) -> None:
        torch.save(obj, os.path.join(out, name), **kw)
        man.append({"name": name, "what": what})

    lin = torch.nn.Linear(4, 3)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 2)
    )
    net(torch.randn(2, 1, 4, 4)).sum().backward()
    adam = torch.optim.Adam(net.parameters(), lr=1e-3)
    adam.step()
    sgd = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(torch.randn(2, 4)).sum().backward()
    sgd.step()
    sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=3)
    cfg = argparse.Namespace(lr=1e-3, epochs=10, arch="resnet", layers=[1, 2, 3], flag=True)

    save("b01_tensor.pt", torch.randn(3, 4), "a tensor")
    save("b02_state_dict.pt", lin.state_dict(), "nn.Linear state dict")
    save("b03_model_adam.pt", {"model": net.state_dict(), "optimizer": adam.state_dict(), "epoch": 3}, "model + Adam state")
    save(
        "b04_sgd_momentum.pth",
        {"model": lin.state_dict(), "optimizer": sgd.state_dict(), "scheduler": sched.state_dict()},
        "SGD momentum + scheduler",
    )
    save("b05_argparse_config.pt", {"args": cfg, "state_dict": lin.state_dict()}, "argparse config")
    save("b06_numpy_scalars.pt", {"best": np.float64(0.93), "step": np.int64(12), "flag": np.bool_(True)}, "NumPy scalars")
    save("b07_numpy_array.pt", {"mean": np.arange(6, dtype=np.float32).reshape(2, 3), "idx": np.array([1, 2, 3])}, "NumPy arrays")
    save("b08_slice.pt", {"window": slice(2, 10, 2), "all": slice(None)}, "slices")
    save("b09_set.pt", {"classes": {"cat", "dog"}, "frozen": frozenset({1, 2})}, "sets")
    save(
        "b10_ordered_dict.pt",
        collections.OrderedDict(a=torch.ones(2), b=collections.OrderedDict(c=torch.zeros(1))),
        "nested OrderedDicts",
    )
    save("b11_half_types.pt", {"bf16": torch.randn(3).bfloat16(), "f16": torch.randn(3).half()}, "bfloat16 / float16")
    save(
        "b12_float8.pt",
        {"f8": torch.randn(4).to(torch.float8_e4m3fn), "u16": torch.arange(4).to(torch.uint16)},
        "v3 dtypes (UntypedStorage)",
    )
    save("b13_complex.pt", torch.randn(3, dtype=torch.complex64), "complex tensor")
    save("b14_sparse.pt", torch.eye(3).to_sparse(), "sparse COO")
    save("b15_quantized.pt", torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8), "quantized tensor")
    save("b16_parameter.pt", {"p": torch.nn.Parameter(torch.randn(2))}, "Parameter")
    save(
        "b17_size_device_dtype.pt",
        {"size": torch.Size([2, 3]), "device": torch.device("cpu"), "dtype": torch.float32},
        "Size, device, dtype",
    )
    base = torch.arange(10.0)
    save("b18_views.pt", {"base": base, "view": base[2:5], "t": base.view(2, 5).t()}, "shared storage views")
    save("b19_protocol4.pt", lin.state_dict(), "pickle_protocol=4", pickle_protocol=4)
    save("b20_legacy_state_dict.pt", lin.state_dict(), "legacy stream format", _use_new_zipfile_serialization=False)
    save("b21_legacy_tensor.pt", torch.arange(5), "legacy stream format tensor", _use_new_zipfile_serialization=False)
    save(
        "b22_builtins.pt",
        {"l": [1, 2.5, None, True], "t": (1, "a"), "s": "text", "b": b"\x00\x01", "c": 1 + 2j},
        "builtin values",
    )
    save("b23_bytearray.pt", {"buf": bytearray(b"abc")}, "bytearray")
    save("b24_counter.pt", {"hist": collections.Counter("hello")}, "Counter")
    save("b25_conj.pt", torch.randn(2, dtype=torch.complex64).conj(), "conj view")
    save("b26_empty.pt", {"e": torch.empty(0), "scalar": torch.tensor(3.0)}, "empty and 0-d tensors")
    save(
        "b27_lightning_like.ckpt",
        {
            "epoch": 1,
            "global_step": 10,
            "state_dict": lin.state_dict(),
            "optimizer_states": [sgd.state_dict()],
            "lr_schedulers": [sched.state_dict()],
            "hyper_parameters": {"lr": 0.1, "name": "m"},
        },
        "Lightning-style checkpoint",
    )
    torch.serialization.set_crc32_options(False)
    try:
        save("b28_no_crc.pt", lin.state_dict(), "compute_crc32=False")
    finally:
        torch.serialization.set_crc32_options(True)
    save(
        "b29_int_types.pt",
        {"i8": torch.arange(3, dtype=torch.int8), "b": torch.tensor([True, False]), "i64": torch.arange(3)},
        "integer and bool tensors",
    )
    save(
        "b30_protocol4_legacy.pt",
        {"x": torch.ones(2)},
        "legacy stream at protocol 2 with nested dict",
        _use_new_zipfile_serialization=False,
    )

    # TorchScript
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = torch.nn.Linear(3, 2)
            self.register_buffer("buf", torch.arange(3))

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.l(x) + self.buf.sum()

    sm = torch.jit.script(M())
    torch.jit.save(sm, os.path.join(out, "b31_scripted.pt"), _extra_files={"meta.json": '{"v": 1}'})
    man.append({"name": "b31_scripted.pt", "what": "TorchScript scripted module with an extra file"})
    torch.jit.save(torch.jit.trace(M(), torch.randn(1, 3)), os.path.join(out, "b32_traced.pt"))
    man.append({"name": "b32_traced.pt", "what": "TorchScript traced module"})
    sm._save_for_lite_interpreter(os.path.join(out, "b33_lite.ptl"))
    man.append({"name": "b33_lite.ptl", "what": "lite interpreter module (bytecode.pkl)"})

    # .pt2
    ep = torch.export.export(M(), (torch.randn(1, 3),))
    torch.export.save(ep, os.path.join(out, "b34_exported.pt2"))
    man.append({"name": "b34_exported.pt2", "what": "torch.export .pt2"})

    # DCP
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": lin.state_dict(), "step": 5, "name": "run1"}, checkpoint_id=os.path.join(out, "b35_dcp"), no_dist=True)
    man.append({"name": "b35_dcp", "what": "distributed checkpoint directory"})

    # NumPy files
    np.save(os.path.join(out, "b36_array.npy"), np.arange(12, dtype=np.float32).reshape(3, 4))
    man.append({"name": "b36_array.npy", "what": ".npy numeric"})
    np.savez(os.path.join(out, "b37_arrays.npz"), a=np.ones(3), b=np.arange(4))
    man.append({"name": "b37_arrays.npz", "what": ".npz numeric"})
    np.save(os.path.join(out, "b38_object_array.npy"), np.array(["a", 1, None], dtype=object), allow_pickle=True)
    man.append({"name": "b38_object_array.npy", "what": ".npy object array of builtins"})

    # plain pickles of data
    def dump(name: str, obj: object, what: str, proto: int) -> None:
        with open(os.path.join(out, name), "wb") as f:
            pickle.dump(obj, f, protocol=proto)
        man.append({"name": name, "what": what})

    dump("b39_dict.pkl", {"a": [1, 2, 3], "b": {"c": (4.5, None)}, "d": b"x" * 10}, "builtins at protocol 5", 5)
    dump("b40_numpy.pkl", {"x": np.linspace(0, 1, 5), "y": np.float32(2.0)}, "NumPy values at protocol 4", 4)
    dump(
        "b41_datetime_path.pkl",
        {"when": datetime.datetime(2024, 1, 2, 3, 4, 5), "day": datetime.date(2024, 1, 2), "p": pathlib.PurePosixPath("/data/x")},
        "datetime and paths",
        2,
    )
    dump("b42_proto0.pkl", {"k": [1, "two", 3.0]}, "protocol 0 text pickle", 0)
    with gzip.open(os.path.join(out, "b43_compressed.joblib"), "wb") as f:
        pickle.dump({"weights": [0.1, 0.2], "classes": ["a", "b"]}, f, protocol=4)
    man.append({"name": "b43_compressed.joblib", "what": "gzip-compressed pickle (joblib-style)"})
    buf = io.BytesIO()
    torch.save(lin.state_dict(), buf)
    with zipfile.ZipFile(os.path.join(out, "b44_model_bundle.zip"), "w") as z:
        z.writestr("model.pt", buf.getvalue())
        z.writestr("config.json", json.dumps({"a": 1}))
    man.append({"name": "b44_model_bundle.zip", "what": "a zip bundling a checkpoint and a config"})
    with open(os.path.join(out, "b45_readme.txt"), "w") as f:
        f.write("config: this model was trained on ...\n")
    man.append({"name": "b45_readme.txt", "what": "a text file next to the model"})

    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    print(f"wrote {len(man)} benign artifacts to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

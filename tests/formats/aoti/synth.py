"""Synthetic AOTInductor packages for tests that need no compiler (layout per spec aoti.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from torchless.container.zip import TorchZipWriter
from torchless.core.tensor import Tensor
from torchless.formats.pt.write import save_checkpoint

STEM = "c" + "a" * 51
META = {
    "AOTI_DEVICE_KEY": "cpu",
    "AOTI_PLATFORM": "linux",
    "AOTI_MACHINE": "x86_64",
    "AOTI_CPU_ISA": "AVX2",
    "AOTI_COMPUTE_CAPABILITY": "",
}


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def wrapper_cpp(consts: dict[str, np.ndarray]) -> str:
    lines = [
        f"    : AOTInductorModelBase(1,\n                           1,\n                           {len(consts)},",
        '    inputs_info_[0].name = "arg0_1";',
    ]
    for i, (fqn, a) in enumerate(consts.items()):
        name = fqn.replace(".", "_")
        strides = [s // a.itemsize for s in a.strides]
        lines += [
            f'    constants_info_[{i}].name = "{name}";',
            f"    constants_info_[{i}].dtype = cached_torch_dtype_{a.dtype.name if a.dtype.name != 'bool' else 'bool'};",
            f"    constants_info_[{i}].device_type = cached_torch_device_type_cpu;",
            f"    constants_info_[{i}].offset = 0;",
            f"    constants_info_[{i}].data_size = {_align(a.nbytes)};",
            f"    constants_info_[{i}].from_folded = false;",
            f"    constants_info_[{i}].type = static_cast<int32_t>(torch::aot_inductor::ConstantType::Parameter);",
            f"    constants_info_[{i}].shape = {{{', '.join(map(str, a.shape))}}};",
            f"    constants_info_[{i}].stride = {{{', '.join(map(str, strides))}}};",
            f"    constants_info_[{i}].layout = static_cast<int32_t>(cached_torch_layout_strided);",
            f'    constants_info_[{i}].original_fqn = "{fqn}";',
        ]
    lines.append('    outputs_info_[0].name = "output0";')
    return "\n".join(lines) + "\n"


def blob(consts: dict[str, np.ndarray]) -> bytes:
    out = b""
    for a in consts.values():
        raw = np.ascontiguousarray(a).tobytes()
        out += raw + b"\0" * (_align(len(raw)) - len(raw))
    return out


def make_package(
    path: Path,
    consts: dict[str, np.ndarray],
    *,
    layout: str = "binary_blob",
    extra: dict[str, bytes] | None = None,
    prefix: str = "pkg",
) -> Path:
    """Write a package with a wrapper.cpp constant table and the weights in ``layout``."""
    d = "data/aotinductor/model/"
    w = TorchZipWriter(path, prefix=prefix)
    w.write(d + f"{STEM}.wrapper.cpp", wrapper_cpp(consts).encode())
    w.write(d + f"{STEM}.wrapper_metadata.json", json.dumps(META).encode())
    if layout == "binary_blob":
        w.write(d + f"{STEM}.wrapper_weights.blob", blob(consts))
    elif layout == "embedded":
        w.write(d + f"{STEM}.wrapper.so", make_elf(blob(consts)))
    elif layout == "object":  # package_cpp_only: sources, CMake file and the weights object
        obj = f"{'c' + 'b' * 51}.weights.o"
        w.write(d + obj, make_elf(blob(consts), relocatable=True))
        cmake = "".join(
            f"target_sources(aoti_model PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}}/{n})\n" for n in (f"{STEM}.wrapper.cpp", obj)
        )
        w.write(d + "CMakeLists.txt", cmake.encode())
    elif layout == "pickle_weights":
        cfg: dict[str, Any] = {}
        for i, (fqn, a) in enumerate(consts.items()):
            tmp = path.with_name(f"w{i}.pt")
            save_checkpoint(Tensor.from_numpy(np.ascontiguousarray(a)), tmp)
            w.write(f"data/weights/weight_{i}", tmp.read_bytes())
            tmp.unlink()
            cfg[fqn] = [f"weight_{i}", list(a.shape), [s // a.itemsize for s in a.strides], 0]
        w.write(d + "weights_config.json", json.dumps(cfg).encode())
    for k, v in (extra or {}).items():
        w.write(k, v)
    w.write("archive_format", b"pt2")
    w.write("archive_version", b"0")
    w.close()
    return path


def sample_consts() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "l1.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "l1.bias": rng.standard_normal(16).astype(np.float32),
        "emb": np.arange(12, dtype=np.int64).reshape(3, 4),
        "h": rng.standard_normal(5).astype(np.float16),
    }


def make_elf(
    payload: bytes,
    *,
    relocatable: bool = False,
    start_shndx: int = 1,
    exports: tuple[str, ...] = ("AOTInductorModelContainerRun",),
) -> bytes:
    """A minimal little-endian ELF64 (shared object, or object file) whose section 1 holds
    ``payload`` between ``_binary_constants_bin_start``/``_end`` (as AotCodeCompiler links it)."""
    import struct

    names = [b"", b"_binary_constants_bin_start", b"_binary_constants_bin_end", *(e.encode() for e in exports)]
    strtab = b"\0".join(names) + b"\0"
    offs = [0]
    for n in names[:-1]:
        offs.append(offs[-1] + len(n) + 1)
    addr = 0 if relocatable else 0x4000
    syms = struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)
    syms += struct.pack("<IBBHQQ", offs[1], 0x10, 0, start_shndx, addr, 0)
    syms += struct.pack("<IBBHQQ", offs[2], 0x10, 0, 1, addr + len(payload), 0)
    for i in range(len(exports)):
        syms += struct.pack("<IBBHQQ", offs[3 + i], 0x12, 0, 1, addr, 0)
    shstr = b"\0.lrodata\0.dynsym\0.dynstr\0.shstrtab\0"
    body = bytearray(64)

    def put(data: bytes) -> int:
        while len(body) % 64:
            body.append(0)
        off = len(body)
        body.extend(data)
        return off

    o_data, o_sym, o_str, o_shs = put(payload), put(syms), put(strtab), put(shstr)
    while len(body) % 8:
        body.append(0)
    shoff = len(body)
    symtype = 2 if relocatable else 11
    sh = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 1, 0x2, addr, o_data, len(payload), 0, 0, 64, 0),
        (10, symtype, 0x2, 0, o_sym, len(syms), 3, 1, 8, 24),
        (18, 3, 0x2, 0, o_str, len(strtab), 0, 0, 1, 0),
        (26, 3, 0, 0, o_shs, len(shstr), 0, 0, 1, 0),
    ]
    for s in sh:
        body.extend(struct.pack("<IIQQQQIIQQ", *s))
    hdr = struct.pack(
        "<16sHHIQQQIHHHHHH",
        b"\x7fELF\x02\x01\x01" + b"\0" * 9,
        1 if relocatable else 3,
        62,
        1,
        0,
        0,
        shoff,
        0,
        64,
        56,
        0,
        64,
        len(sh),
        4,
    )
    body[:64] = hdr
    return bytes(body)

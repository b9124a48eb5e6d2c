"""Generate carrier-level samples: payloads that real loaders run through carriers the
scanner once failed to recognise (issue 10 root causes 1, 3, 4, 6, 8, 9, 12).

Usage: ``python gen_carriers.py OUT_DIR [--no-torch]``

Each payload only creates a marker file named after the sample in the directory named by
``TORCHLESS_SCAN_MARKER_DIR`` at load time. ``OUT_DIR/manifest.json`` lists every sample:
``name``, ``loader`` (for ``run_loader.py``; None when no loader is expected to run
anything), ``expect`` (the verdict the scan must give), ``rules`` (rules that must be among
the findings) and the technique.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import pickle
import struct
import sys
import tarfile
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_malicious import G, S, T, _plain_pickle_load, call, inject, os_system, pk, sh  # noqa: E402


def proto0_payload(name: str) -> bytes:
    """A protocol-0 pickle (no PROTO: starts with ``c``) that runs ``touch marker``."""
    return b"cos\nsystem\n(S'" + sh(name).encode() + b"'\ntR."


def npy(descr_literal: str, body: bytes, version: tuple[int, int] = (1, 0)) -> bytes:
    header = "{'descr': %s, 'fortran_order': False, 'shape': (1,), }" % descr_literal
    enc = header.encode("utf8" if version == (3, 0) else "latin1")
    width = 2 if version == (1, 0) else 4
    total = 6 + 2 + width + len(enc) + 1
    enc += b" " * ((64 - total % 64) % 64) + b"\n"
    length = struct.pack("<H" if width == 2 else "<I", len(enc))
    return b"\x93NUMPY" + bytes(version) + length + enc + body


def npz(members: list[tuple[str, bytes]]) -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as zf:
        for name, data in members:
            zf.writestr(name, data)
    return b.getvalue()


def tar_bytes(storages: bytes, tensors: bytes, obj: bytes, *, no_magic: bool = False) -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT if no_magic else tarfile.PAX_FORMAT) as tf:
        for name, data in (("storages", storages), ("tensors", tensors), ("pickle", obj)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    data = bytearray(b.getvalue())
    if no_magic:  # v7 headers: no "ustar" magic, checksum recomputed (tarfile still reads them)
        pos = 0
        while pos + 512 <= len(data) and data[pos] != 0:
            hdr = data[pos : pos + 512]
            hdr[257:265] = b"\0" * 8
            hdr[148:156] = b" " * 8
            hdr[148:156] = b"%06o\0 " % sum(hdr)
            data[pos : pos + 512] = hdr
            size = int(hdr[124:136].strip(b"\0 ") or b"0", 8)
            pos += 512 + (size + 511) // 512 * 512
    return bytes(data)


def plain_samples() -> list[dict]:
    """Samples that need no torch to build: (name, loader, expect, rules, technique, bytes)."""
    out: list[dict] = []

    def add(name: str, loader: str | None, expect: str, rules: list[str], technique: str, data: bytes) -> None:
        out.append({"name": name, "loader": loader, "expect": expect, "rules": rules, "technique": technique, "data": data})

    rnd = bytes((i * 7919 + 13) % 256 for i in range(4096))
    add(
        "x01_random_bytes.pt",
        None,
        "unanalysable",
        ["unrecognized"],
        "random bytes named .pt: nothing runs, but the name claims a model",
        b"\x00" + rnd[1:],
    )
    add(
        "x02_readme.md",
        None,
        "clean",
        [],
        "an ordinary text file: pickle.load stops at byte 0",
        b"# Model card\n\nconfig: trained on ...\ncpu\n",
    )
    add(
        "x03_image.png",
        None,
        "clean",
        [],
        "a PNG header: NEWFALSE then PERSID, which plain pickle.load refuses",
        b"\x89PNG\r\n\x1a\n" + bytes(64),
    )
    # lzma "alone" with a properties byte other than 0x5d (lc=0, lp=0, pb=0): lzma.open reads it
    alone = lzma.compress(
        pk(os_system("x04_lzma_props.pkl.lzma")),
        format=lzma.FORMAT_ALONE,
        filters=[{"id": lzma.FILTER_LZMA1, "lc": 0, "lp": 0, "pb": 0, "dict_size": 1 << 16}],
    )
    add(
        "x04_lzma_props.pkl.lzma",
        "lzma",
        "dangerous",
        ["dangerous-global"],
        "lzma alone header with properties byte 0x00 (the old sniff needed 5d 00 00)",
        alone,
    )
    co = zlib.compressobj(9, zlib.DEFLATED, 9)  # window bits 9: header 0x18, not 0x78
    add(
        "x05_zlib_header.pkl.z",
        "zlib",
        "dangerous",
        ["dangerous-global"],
        "zlib with a 512-byte window (header 0x18 ...)",
        co.compress(pk(os_system("x05_zlib_header.pkl.z"))) + co.flush(),
    )
    zdata = zlib.compress(pk(os_system("x06_joblib_zfile.pkl")))
    plain = pk(os_system("x06_joblib_zfile.pkl"))
    add(
        "x06_joblib_zfile.pkl",
        "joblib",
        "dangerous",
        ["dangerous-global"],
        "joblib < 0.9.3 'ZF' zfile: ZF + hex length + zlib",
        b"ZF" + hex(len(plain)).encode().ljust(19) + zdata,
    )
    add(
        "x07_npy_descr_object.npy",
        "numpy",
        "dangerous",
        ["dangerous-global"],
        ".npy whose descr is 'object' (no capital O: the old substring test missed it)",
        npy("'object'", proto0_payload("x07_npy_descr_object.npy")),
    )
    add(
        "x08_npy_struct_object.npy",
        "numpy",
        "dangerous",
        ["dangerous-global"],
        ".npy with a structured dtype holding an object field in a sub-array",
        npy("[('a', '<i4'), ('b', ('O', (2,)))]", proto0_payload("x08_npy_struct_object.npy")),
    )
    add(
        "x09_npy_v3_utf8.npy",
        "numpy",
        "dangerous",
        ["dangerous-global"],
        ".npy version 3.0 (UTF-8 header)",
        npy("'|O'", proto0_payload("x09_npy_v3_utf8.npy"), (3, 0)),
    )
    inner = npz([("x.npy", npy("'|O'", proto0_payload("x10_npz_shifted.npz")))])
    decoy = b"PK\x03\x04" + b"\x00" * 60  # numpy sees PK magic; zipfile finds the archive after it
    add(
        "x10_npz_shifted.npz",
        "numpy",
        "dangerous",
        ["dangerous-global"],
        ".npz with data before the archive: zipfile shifts every offset, miniz does not",
        decoy + inner,
    )
    deep = npy("'|O'", b"")[:10]
    hdr = ("(" * 5000 + ")" * 5000).encode()
    add(
        "x11_npy_deep_header.npy",
        None,
        "unanalysable",
        ["unanalysable"],
        ".npy header nested 5000 deep: never an ast/tokenize crash",
        deep[:8] + struct.pack("<H", len(hdr)) + hdr,
    )
    zero, empty, obj = pickle.dumps(0, protocol=2), pickle.dumps([], protocol=2), pickle.dumps({"e": 1}, protocol=2)
    n = "x12_tar_no_magic.tar"
    add(
        n,
        "torch",
        "dangerous",
        ["dangerous-global"],
        "legacy tar whose headers lack the ustar magic (tarfile reads v7)",
        tar_bytes(zero + empty, zero, inject(obj, os_system(n)), no_magic=True),
    )
    rec = b"\x80\x02" + T(S("0"), S("cpu"), G("torch", "FloatStorage")) + b"."
    n = "x13_tar_bool_count.tar"
    add(
        n,
        "torch",
        "dangerous",
        ["dangerous-global"],
        "legacy tar: storage count True (range(True) runs once), payload in storage_views",
        tar_bytes(b"\x80\x02\x88." + rec + struct.pack("<q", 0) + pk(os_system(n)), zero, obj),
    )
    n = "x14_tar_65_dims.tar"
    targs = b"\x80\x02" + T(S("t"), S("0"), b"N") + b"."
    second = b"\x80\x02" + os_system(n) + b"0" + T(S("u"), S("0"), b"N") + b"."
    tensors = (
        b"\x80\x02K\x02."
        + targs
        + struct.pack("<ii", 65, 0)
        + struct.pack("<65q", *([1] * 65)) * 2
        + struct.pack("<q", 0)
        + second
    )
    add(
        n,
        "torch",
        "dangerous",
        ["dangerous-global"],
        "legacy tar: a 65-dim tensor (torch reads it), payload in the next tensor's args",
        tar_bytes(b"\x80\x02K\x01." + rec + struct.pack("<q", 0) + empty, tensors, obj),
    )
    return out


def torch_samples(out_dir: str) -> list[dict]:
    import torch
    import torch.distributed.checkpoint as dcp

    out: list[dict] = []

    def rec(name: str, loader: str | None, expect: str, rules: list[str], technique: str) -> None:
        out.append({"name": name, "loader": loader, "expect": expect, "rules": rules, "technique": technique})

    # _load_from_bytes with bytes built by _codecs.encode(str, 'latin1'): the inner stream is
    # protocol 0 (first byte 'c'), which the old "looks like a pickle" test did not follow
    n = "x20_load_from_bytes_codecs.pt"
    inner = proto0_payload(n).decode("latin1")
    body = call(G("torch.storage", "_load_from_bytes"), call(G("_codecs", "encode"), S(inner), S("latin1")))
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(os.path.join(out_dir, n), "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = inject(pickle.dumps({"w": 1}, protocol=2), body)
            zf.writestr(info.filename, data)
    rec(
        n,
        "torch",
        "dangerous",
        ["dangerous-global", "nested-loader"],
        "torch.storage._load_from_bytes(_codecs.encode(protocol-0 stream, 'latin1'))",
    )

    # a DCP checkpoint whose item file is not called *.distcp and whose byte item is a
    # protocol-0 legacy stream (torch.load of the slice: no zip, a pickle)
    n = "x21_dcp_any_name"
    d = os.path.join(out_dir, n)
    dcp.save({"w": torch.ones(2), "extra": "x" * 400}, checkpoint_id=d, no_dist=True)
    meta_path = os.path.join(d, ".metadata")
    with open(meta_path, "rb") as f:
        meta = _plain_pickle_load(f.read())
    payload = proto0_payload(n)
    renamed: dict[str, str] = {}
    for idx, info in meta.storage_data.items():
        old = info.relative_path
        renamed.setdefault(old, f"shard{len(renamed)}.bin")
        info.relative_path = renamed[old]
        if idx.fqn == "extra":
            with open(os.path.join(d, old), "r+b") as f:
                f.seek(info.offset)
                assert info.length >= len(payload)
                f.write(payload)
    for old, new in renamed.items():
        os.rename(os.path.join(d, old), os.path.join(d, new))
    with open(meta_path, "wb") as f:
        pickle.dump(meta, f, protocol=2)
    rec(
        n,
        "dcp",
        "dangerous",
        ["dangerous-global"],
        "DCP item file named shard0.bin; the byte item is a protocol-0 pickle read by torch.load(weights_only=False)",
    )

    # a DCP item file that is a symlink out of the checkpoint folder
    n = "x22_dcp_link"
    d = os.path.join(out_dir, n)
    dcp.save({"w": torch.ones(2), "extra": "y" * 400}, checkpoint_id=d, no_dist=True)
    with open(os.path.join(d, ".metadata"), "rb") as f:
        meta = _plain_pickle_load(f.read())
    outside = os.path.join(out_dir, "x22_outside.bin")
    (item_name,) = {i.relative_path for k, i in meta.storage_data.items() if k.fqn == "extra"}
    os.rename(os.path.join(d, item_name), outside)
    for k, i in meta.storage_data.items():
        if k.fqn == "extra":
            with open(outside, "r+b") as f:
                f.seek(i.offset)
                f.write(proto0_payload(n))
    os.symlink(os.path.relpath(outside, d), os.path.join(d, item_name))
    rec(
        n,
        "dcp",
        "unanalysable",
        ["link-escape", "unanalysable"],
        "DCP item file is a symlink to a file outside the checkpoint folder",
    )
    return out


def main(argv: list[str]) -> int:
    out_dir = argv[0]
    os.makedirs(out_dir, exist_ok=True)
    manifest = []
    for s in plain_samples():
        with open(os.path.join(out_dir, s["name"]), "wb") as f:
            f.write(s.pop("data"))
        manifest.append(s)
    if "--no-torch" not in argv:
        try:
            import torch  # noqa: F401

            manifest += torch_samples(out_dir)
        except ImportError:
            pass
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(manifest)} carrier samples to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

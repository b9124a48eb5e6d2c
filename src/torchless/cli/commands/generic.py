"""Commands that work on every format: info, ls, convert, diff, verify."""

from __future__ import annotations

import argparse

from typing import Any

import numpy as np

from ..._api import convert, open as open_artifact
from ...core.errors import UnsupportedError
from ...core.tensor import Tensor
from ..progress import Progress
from ..render import format_bytes, format_info, format_json, format_table

__all__ = ["register", "diff_artifacts"]


def _open(path: str, fmt: str | None) -> Any:
    # inspection never executes anything, so unknown globals become placeholders to show
    return open_artifact(path, format=fmt, weights_only=False)


def cmd_info(args: argparse.Namespace) -> int:
    with _open(args.path, args.format) as art:
        info = art.info()
    print(format_json(info) if args.json else format_info(info))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with _open(args.path, args.format) as art:
        rows = []
        out = []
        for name, t in art.tensors():
            shape = list(t.shape)
            if args.json:
                out.append({"name": name, "dtype": t.dtype.name, "shape": shape, "nbytes": t.nbytes})
            else:
                rows.append([name, t.dtype.name, "[" + ", ".join(map(str, shape)) + "]", format_bytes(t.nbytes)])
    if args.json:
        print(format_json(out))
    else:
        print(format_table(rows))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    with _open(args.src, args.format) as art:
        total = sum(t.nbytes for _, t in art.tensors())
    prog = Progress(total, f"convert {args.dst}")
    try:
        extra = {"max_shard_size": args.max_shard_size} if getattr(args, "max_shard_size", None) else {}
        res = convert(args.src, args.dst, src_format=args.format, dst_format=args.to, progress=prog, **extra)
    finally:
        prog.close()
    print(f"wrote {args.dst}: {res['tensors']} tensors, {format_bytes(res['bytes'])}")
    return 0


def _values(t: Any) -> np.ndarray:
    if isinstance(t, Tensor) and t.quantizer is not None:
        return t.dequantize()
    arr = t.numpy()
    return np.asarray(arr)


def diff_artifacts(a: Any, b: Any, *, rtol: float = 0.0, atol: float = 0.0) -> dict[str, Any]:
    """Compare the tensors of two artifacts by name.

    Returns ``{"added": [...], "removed": [...], "changed": [{name, reason, max_abs_diff}],
    "same": n}``.
    """
    ta = dict(a.tensors())
    tb = dict(b.tensors())
    added = sorted(set(tb) - set(ta))
    removed = sorted(set(ta) - set(tb))
    changed = []
    same = 0
    for name in [n for n in ta if n in tb]:
        x, y = ta[name], tb[name]
        if x.dtype.name != y.dtype.name or tuple(x.shape) != tuple(y.shape):
            changed.append({"name": name, "reason": f"{x.dtype.name}{list(x.shape)} -> {y.dtype.name}{list(y.shape)}", "max_abs_diff": None})
            continue
        try:
            xv, yv = _values(x), _values(y)
        except UnsupportedError:
            same += 1
            continue
        if xv.dtype.kind in "fcV" or xv.dtype.type.__module__ != "numpy":
            xf = xv.astype(np.complex128 if xv.dtype.kind == "c" else np.float64)
            yf = yv.astype(np.complex128 if yv.dtype.kind == "c" else np.float64)
            eq_nan = np.isnan(xf) & np.isnan(yf)
            d = np.where(eq_nan, 0, np.abs(xf - yf))
            mad = float(np.nanmax(d)) if d.size else 0.0
            bad = bool(np.any(d > atol + rtol * np.abs(yf))) if d.size else False
        else:
            d = np.abs(xv.astype(np.float64) - yv.astype(np.float64)) if xv.size else np.zeros(0)
            mad = float(d.max()) if d.size else 0.0
            bad = mad > atol
        if bad:
            changed.append({"name": name, "reason": "values", "max_abs_diff": mad})
        else:
            same += 1
    return {"added": added, "removed": removed, "changed": changed, "same": same}


def cmd_diff(args: argparse.Namespace) -> int:
    with _open(args.a, args.format) as a, _open(args.b, args.format) as b:
        res = diff_artifacts(a, b, rtol=args.rtol, atol=args.atol)
    if args.json:
        print(format_json(res))
    else:
        for n in res["added"]:
            print(f"+ {n}")
        for n in res["removed"]:
            print(f"- {n}")
        for c in res["changed"]:
            extra = f" (max abs diff {c['max_abs_diff']:.6g})" if c["max_abs_diff"] is not None else ""
            print(f"~ {c['name']}: {c['reason']}{extra}")
        print(f"{len(res['added'])} added, {len(res['removed'])} removed, {len(res['changed'])} changed, {res['same']} same")
    return 1 if (res["added"] or res["removed"] or res["changed"]) else 0


def cmd_verify(args: argparse.Namespace) -> int:
    with _open(args.path, args.format) as art:
        problems = art.verify()
    errors = [p for p in problems if p.severity == "error"]
    if args.json:
        print(format_json({"path": args.path, "ok": not errors, "problems": [p.to_dict() for p in problems]}))
    else:
        for p in problems:
            where = f" [{p.member}]" if p.member else ""
            at = f" @{p.offset}" if p.offset is not None else ""
            print(f"{p.severity}: {p.code}{where}{at}: {p.message}")
        print(f"{args.path}: {'OK' if not errors else 'FAILED'} ({len(errors)} errors, {len(problems) - len(errors)} warnings)")
    return 1 if errors else 0


def register(sub: Any) -> None:
    def add(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    p = add("info", cmd_info, "summarize an artifact: format, writer, tensors, parameters, bytes by dtype, object tree")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--format", help="skip detection")
    p = add("ls", cmd_ls, "list tensors, one a line: name, dtype, shape, size")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--format")
    p = add("convert", cmd_convert, "copy all tensors into a new file (.pt, .safetensors, .npz ...), dtypes preserved")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--format", help="source format (skip detection)")
    p.add_argument("--to", help="destination format (default: from its extension)")
    p.add_argument("--max-shard-size", help="safetensors: split into Hugging Face style shards of at most this size (5GB, 500MiB) plus an index json")
    p = add("diff", cmd_diff, "compare tensors of two artifacts: added, removed, changed (max abs difference)")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", action="store_true")
    p.add_argument("--format")
    p.add_argument("--rtol", type=float, default=0.0)
    p.add_argument("--atol", type=float, default=0.0)
    p = add("verify", cmd_verify, "check structure, CRCs and tensor bounds; exit 1 on problems")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--format")



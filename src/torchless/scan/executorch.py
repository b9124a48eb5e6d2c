"""ExecuTorch programs (``.pte``) in the scanner.

A ``.pte`` is a FlatBuffers program: the ExecuTorch runtime resolves its operators against
the kernels registered in the binary it runs in and hands each delegate blob to that
backend's own parser. The format has no pickle and no code the runtime would compile or
import, so a well-formed program is reported for information; its delegate blobs (backend
payloads parsed by native code) are named, not analysed. A program the reader cannot
parse is ``unanalysable``.
"""

from __future__ import annotations

import os
from typing import Any

from ..container.flatbuffer import FlatBuffer
from ..core.errors import TorchlessError
from ..formats.executorch.spec import P

__all__ = ["report_pte"]

_LOADER = "executorch Program::load"


def report_pte(scanner: Any, data: Any, member: str | None) -> None:
    """The :class:`~torchless.scan.carriers.base.ScanEngine` hook for ``ET..`` buffers."""
    loc = member or os.path.basename(scanner.path)
    try:
        fb = FlatBuffer(data, loc, what="ExecuTorch program")
        root = fb.root()
        ident = bytes(fb.b[4:8]).decode("latin-1")
        plans = root.tables(P.PROGRAM_PLANS, "ExecutionPlan")
        ops: set[str] = set()
        delegates: list[str] = []
        for plan in plans:
            for o in plan.tables(P.PLAN_OPERATORS, "Operator"):
                name, overload = o.string(P.OP_NAME) or "", o.string(P.OP_OVERLOAD) or ""
                ops.add(f"{name}.{overload}" if overload else name)
            delegates += [d.string(P.DELEGATE_ID) or "?" for d in plan.tables(P.PLAN_DELEGATES, "BackendDelegate")]
    except TorchlessError as e:
        scanner.add(
            "unanalysable",
            "high",
            f"ExecuTorch program not analysed: {e.message}; the ExecuTorch runtime reads this format",
            member,
            e.offset,
            loader=_LOADER,
        )
        return
    msg = f"ExecuTorch program ({ident}): no pickle; {len(plans)} execution plan(s) calling {len(ops)} registered operator(s)"
    if delegates:
        msg += (
            f"; {len(delegates)} delegate blob(s) for {', '.join(sorted(set(delegates)))} are parsed by those "
            "backends' native code and not analysed here"
        )
    scanner.add("unrecognized", "info", msg, member, loader=_LOADER)

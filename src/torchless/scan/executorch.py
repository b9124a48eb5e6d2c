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

from ..core.errors import TorchlessError

__all__ = ["report_pte"]

_LOADER = "executorch Program::load"


def report_pte(scanner: Any, data: Any, member: str | None) -> None:
    """The :class:`~torchless.scan.carriers.Scanner` hook for ``ET..`` buffers."""
    from ..formats.executorch.read import read_program

    loc = member or os.path.basename(scanner.path)
    try:
        prog = read_program(data, loc)
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
    delegates = [d for p in prog.plans for d in p.delegates]
    ops = sorted({f"{n}.{o}" if o else n for p in prog.plans for n, o in p.operators})
    msg = (
        f"ExecuTorch program ({prog.identifier}): no pickle; {len(prog.plans)} execution plan(s) calling "
        f"{len(ops)} registered operator(s)"
    )
    if delegates:
        ids = sorted({d.id for d in delegates})
        msg += (
            f"; {len(delegates)} delegate blob(s) for {', '.join(ids)} ({sum(len(d.blob) for d in delegates)} bytes) "
            "are parsed by those backends' native code and not analysed here"
        )
    scanner.add("unrecognized", "info", msg, member, loader=_LOADER)

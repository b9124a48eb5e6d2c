"""The scanner's symbolic run against the real unpicklers, stream by stream.

:mod:`.analysis` runs a stream symbolically; :mod:`.engine` runs it through CPython's own
unpicklers (recording, inert) in a resource-limited child process. This module runs both
and compares their records: :func:`second_opinion` for one stream during a scan,
:func:`check_stream` for the differential fuzzer. It sits above both, so that neither the
analysis nor the engine (which its worker process loads as a lone file) imports the other
to compare.
"""

from __future__ import annotations

from typing import Any

from .analysis import analyse
from .engine import (
    ENGINE_MAX_STREAM,
    READERS,
    EngineTimeout,
    Record,
    _first_diff,
    compare,
    digest,
    record_c,
    record_of,
    record_python,
    shared_worker,
)

__all__ = ["check_stream", "second_opinion", "symbolic_record"]


def symbolic_record(data: bytes, *, start: int = 0) -> tuple[Record, Any]:
    """The scanner's symbolic run of the stream at ``start``, as a :class:`Record`.

    Returns the record and the :class:`~torchless.scan.analysis.StreamResult`.
    """
    res = analyse(data, start=start, record=True)
    return record_of(res), res


def check_stream(data: bytes) -> tuple[list[str], dict[str, int]]:
    """Compare the scanner's symbolic run of ``data`` with the real unpicklers.

    Returns (problems, counters). Per reader path:

    * ``bytes``: the C unpickler must agree exactly (the walk is linear there);
    * ``bytesio``, ``file``, ``zipmember``: exact agreement (with the end offset) unless
      the machine reported a frame hazard, in which case the scanner flags the stream
      (``unanalysable``) and agreement is not required;
    * the pure-Python unpickler: when the model finishes without a hazard, the globals
      and the kinds of events must match (values may differ: its text parsers are
      Python's, not C's), or be a prefix where it stops with an error. A stream the
      model cannot finish is flagged by the scanner whatever Python does.
    """
    problems: list[str] = []
    stats = {"streams": 1}
    model, res = symbolic_record(data)
    hazard = bool(res.frame_hazards)
    if hazard:
        stats["frame_hazard"] = 1
    stats["model_" + model.outcome] = 1
    for reader in READERS:
        if hazard and reader != "bytes":
            continue
        oracle = record_c(data, reader)
        d = compare(oracle, model, check_end=reader != "bytes")
        if d:
            problems.append(f"C unpickler via {reader}: {d}")
    if model.outcome == "ok" and not hazard:
        py = record_python(data, "bytesio")

        def weak(evs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
            return [e[:3] if e[0] == "global" else (e[0],) for e in evs]

        a, b = weak(py.events), weak(model.events)
        if py.outcome == "ok" and a != b:
            problems.append(f"Python unpickler: {_first_diff(a, b)}")
        elif py.outcome == "error" and b[: len(a)] != a:
            problems.append(f"Python unpickler (stopped with {py.error}): {_first_diff(a, b)}")
    return problems, stats


def second_opinion(data: bytes, start: int, end: int | None, res: Any = None) -> str | None:
    """Run the stream at ``start`` through the recording C unpickler (child process) and
    through the scanner's model; a description of the first difference, or None.

    None also when the engine could not answer because the child ran out of its memory or
    CPU limits on this stream (a real loader would have failed too).

    Raises:
        EngineTimeout: the child's wall-clock watchdog fired (the caller reports the
            stream as not fully analysed: a timeout is never a silent agreement).
    """
    stop = end if end is not None else len(data)
    blob = bytes(data[start:stop])
    if len(blob) > ENGINE_MAX_STREAM:
        return None
    if res is not None and res.events is not None and start == res.start and res.norm_exhausted:
        return None  # values too large to compare event by event (known before asking the child)
    w = shared_worker()
    if not w.submit(blob, 0, digest=True):
        return None
    # meanwhile the child runs the real unpickler
    model = record_of(res) if res is not None and res.events is not None and start == res.start else symbolic_record(blob)[0]
    if model.exhausted:  # values too large to compare event by event: no second opinion
        w.result()
        return None
    got = w.result()
    if got is None and w.timed_out:
        raise EngineTimeout(f"no answer within {w.timeout:.0f} s")
    if got is None or got == digest(model.to_wire()):
        return None
    oracle = w.record(blob, 0)  # they differ: fetch the whole record to say where
    if oracle is None and w.timed_out:
        raise EngineTimeout(f"no answer within {w.timeout:.0f} s")
    if oracle is None:
        return None
    return compare(oracle, model, check_end=False)

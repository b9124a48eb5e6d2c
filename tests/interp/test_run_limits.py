"""The interpreter's caps (interp/limits.py) node by node, without torch: each operator asked
for a result far over ``max_elements`` is refused with a LimitError before its kernel runs
(the kernel, run, would fail with a MemoryError, reported as an InternalError), the live
bytes are counted and released at last use, and ``while_loop`` stops at its cap."""

from __future__ import annotations

import time

import numpy as np
import pytest

from torchless.core.errors import LimitError, UsageError
from torchless.graph.ir import Graph, OpRef
from torchless.interp.interpreter import run_graph
from torchless.interp.limits import RUN_LIMITS, RunLimits, run_limits

BIG = 2**40
F32 = np.float32


def _one(key: str, args: tuple, inputs: list[np.ndarray] = (), kwargs: dict | None = None) -> Graph:
    """A graph of one ``key`` node; ``"$0"``, ``"$1"``... in ``args`` stand for placeholders."""
    g = Graph()
    phs = [g.placeholder(f"x{i}") for i in range(len(inputs))]

    def sub(a):
        if isinstance(a, str) and a.startswith("$"):
            return phs[int(a[1:])]
        if isinstance(a, list):
            return [sub(x) for x in a]
        return a

    n = g.call_function(OpRef(key), tuple(sub(a) for a in args), kwargs or {})
    g.output((n,))
    return g


_x4 = np.ones((4, 4096), F32)
_col = np.ones((2**16, 1), F32)
_row = np.ones((1, 2**16), F32)

CASES = {
    "zeros": ("aten.zeros.default", ([BIG, 3],), []),
    "full": ("aten.full.default", ([BIG], 1.0), []),
    "empty": ("aten.empty.memory_format", ([2**20, 2**20],), []),
    "new_zeros": ("aten.new_zeros.default", ("$0", [BIG]), [np.ones(2, F32)]),
    "arange": ("aten.arange.default", (BIG,), []),
    "arange_step": ("aten.arange.start_step", (0, 2 * BIG, 2), []),
    "window": ("aten.hann_window.default", (BIG,), []),
    "histc": ("aten.histc.default", ("$0", BIG), [np.ones(3, F32)]),
    "repeat": ("aten.repeat.default", ("$0", [2**20, 2**20]), [np.ones((1, 1), F32)]),
    "repeat_interleave": ("aten.repeat_interleave.Tensor", ("$0",), [np.array([BIG, BIG], np.int64)]),
    "pad": ("aten.constant_pad_nd.default", ("$0", [0, BIG]), [np.ones((2, 2), F32)]),
    "index_select": ("aten.index_select.default", ("$0", 0, "$1"), [_x4, np.zeros(2**20, np.int64)]),
    "mm": ("aten.mm.default", ("$0", "$1"), [_col, _row]),
    "matmul": ("aten.matmul.default", ("$0", "$1"), [_col, _row]),
    "broadcast": ("aten.add.Tensor", ("$0", "$1"), [_col, _row]),
    "cat": ("aten.cat.default", (["$0"] * 5000,), [np.ones(2**20, F32)]),
    "upsample": ("aten.upsample_nearest2d.vec", ("$0", None, [2.0**16, 2.0**16]), [np.ones((1, 1, 2, 2), F32)]),
    "expand": ("aten.expand.default", ("$0", [2**20, 2**20]), [np.ones((1, 1), F32)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_huge_results_are_refused_before_the_kernel_allocates(name):
    key, args, inputs = CASES[name]
    t0 = time.perf_counter()
    with pytest.raises(LimitError, match="too large for the interpreter's cap") as e:
        run_graph(_one(key, args, inputs), list(inputs))
    assert time.perf_counter() - t0 < 1
    assert key.removeprefix("aten.") in str(e.value)  # names the node and its operator


def test_the_same_nodes_run_under_the_cap():
    assert run_graph(_one("aten.zeros.default", ([3, 2],), []), [])[0].shape == (3, 2)
    assert run_graph(_one("aten.add.Tensor", ("$0", "$1"), [_col[:8], _row[:, :8]]), [_col[:8], _row[:, :8]])[0].shape == (8, 8)
    r = np.array([2, 1], np.int64)
    assert run_graph(_one("aten.repeat_interleave.Tensor", ("$0",), [r]), [r])[0].tolist() == [0, 0, 1]


def test_caps_are_configurable_and_checked():
    g = _one("aten.zeros.default", ([1000],), [])
    with run_limits(RunLimits(max_elements=999)), pytest.raises(LimitError, match="at most 999 elements"):
        run_graph(g, [])
    with run_limits(RunLimits(max_bytes=3999)), pytest.raises(LimitError, match="at most 3999 bytes"):
        run_graph(g, [])
    assert run_graph(g, [])[0].shape == (1000,)  # the block's caps are gone after it
    with pytest.raises(UsageError):
        RunLimits(max_bytes=0)


def _chain(keep: bool) -> Graph:
    """Three 400-byte ``ones`` in a row; all returned (``keep``) or each read once by the next."""
    g = Graph()
    a = g.call_function(OpRef("aten.ones.default"), ([100],))
    b = g.call_function(OpRef("aten.ones.default"), ([100],))
    c = g.call_function(OpRef("aten.add.Tensor"), (a, b))
    d = g.call_function(OpRef("aten.ones.default"), ([100],))
    e = g.call_function(OpRef("aten.add.Tensor"), (c, d))
    g.output((a, b, c, d, e) if keep else (e,))
    return g


def test_live_bytes_are_counted_and_released_at_last_use():
    with run_limits(RunLimits(max_bytes=1300)):
        assert run_graph(_chain(keep=False), [])[0].shape == (100,)  # at most 3 x 400 live
        with pytest.raises(LimitError, match="live intermediates"):
            run_graph(_chain(keep=True), [])  # 5 x 400 live


def _endless_loop() -> Graph:
    cond, body = Graph(), Graph()
    ci = cond.placeholder("i")
    cond.output(cond.call_function(OpRef("_operator.lt"), (ci, 3)))
    bi = body.placeholder("i")
    body.output((body.call_function(OpRef("_operator.add"), (bi, 0)),))
    g = Graph()
    g.subgraphs["cond_graph_0"], g.subgraphs["body_graph_0"] = cond, body
    i = g.placeholder("i")
    w = g.call_function(OpRef("higher_order.while_loop"), (g.get_attr("cond_graph_0"), g.get_attr("body_graph_0"), (i,), ()))
    g.output((g.call_function(OpRef("_operator.getitem"), (w, 0)),))
    return g


def test_while_loop_stops_at_the_iteration_cap():
    with run_limits(RunLimits(max_iterations=200)), pytest.raises(LimitError, match="at most 200 iterations"):
        run_graph(_endless_loop(), [0])
    assert RUN_LIMITS.max_iterations == 100_000

"""The one benchmark harness: fixtures, warm page cache, fresh processes, medians, ratios.

Every measurement is a *child program* run in a fresh interpreter. The child times the
operation itself and prints one JSON line ``{"t": seconds}`` (optionally more keys); the
harness also times the whole process (``wall``) and takes its peak RSS from the kernel
(``ru_maxrss`` of the reaped child, through ``os.wait4``), so nothing is left to the child's
honesty about memory.

Rounds interleave the cases (case A, case B, case A, case B ...), so every ratio compares
figures taken under the same machine load; the reported figure is the median over rounds,
and each ratio is the median of the per-round ratios. The order changes over a cycle of
four rounds (cases declared in pairs A B, C D): A B C D, D C B A, B A D C, C D A B. On
this VM a page the kernel frees is handed back to the host (free page reporting), and
touching it again costs a host fault, so a case that runs right after one that freed as
much memory as it needs may get pages that are still backed and run several times faster
(a raw write of 2.2 GB: 0.71 s or 1.7-3.9 s), and one that runs after a long stretch of
small cases gets none (bench/RESULTS.md, eighth and ninth passes). Over the cycle each
case of a pair comes first after the rest of the round once, right after itself once and
right after its partner twice, so neither case of a pair is favoured; a run of a multiple
of four rounds balances exactly. Inputs are read into the page cache right before each
timed run (the page cache of a shared VM empties after a minute idle).

Usage from a benchmark::

    h = Harness(rounds=5)
    h.case("torchless_list", CODE, args=[path], warm=[path])
    ...
    h.run()
    h.ratio("list", "torchless_list", "safetensors_list", goal=1.5, key="t")
    print(h.markdown())
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable

#: put at the top of every child program: ``P`` (argv[1]), ``ARGS``, ``t = start()`` (wall
#: clock; also marks the CPU clock), ``done(t, **more)`` (reports ``t`` and, after
#: ``start()``, the CPU seconds as ``cpu``)
PRELUDE = r"""
import json, sys, time
ARGS = sys.argv[1:]
P = ARGS[0] if ARGS else None
def start():
    global _CPU0
    _CPU0 = time.process_time()
    return time.perf_counter()
def done(t, **more):
    if "_CPU0" in globals():  # CPU seconds since start(), every thread (user + system)
        more.setdefault("cpu", time.process_time() - _CPU0)
    more["t"] = t
    sys.stdout.write("\nBENCH " + json.dumps(more) + "\n")
    sys.stdout.flush()
"""


#: Child code of the cases several benches share (each a fresh process after PRELUDE:
#: ``P``/``ARGS`` the bench's arguments, ``start()``/``done()`` the timing). The save cases
#: read the state dict eagerly and touch it first, so both write bytes already in memory.
SHARED_CASES = {
    "torchless_read": """
import torchless, torchless.formats.registry as reg
reg.handlers()  # import-time work (the format handlers), outside the timing like the yardstick's imports
t = start()
sd = torchless.load(P, mmap=False)
arrs = [x.storage.bytes() for x in sd.values()]
done(time.perf_counter() - t)
""",
    "numpy_fromfile": """
import numpy as np
t = start()
buf = np.fromfile(P, dtype=np.uint8)
done(time.perf_counter() - t)
""",
    "torchless_save": """
import os, torchless
sd = torchless.load(ARGS[0], mmap=False)
for x in sd.values():
    x.storage.bytes()
t = start()
torchless.save(sd, ARGS[1])
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
    "raw_write": """
import os, torchless
sd = torchless.load(ARGS[0], mmap=False)
bufs = [x.storage.bytes() for x in sd.values()]
t = start()
with open(ARGS[1], "wb") as f:
    for b in bufs:
        f.write(b)
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
}


def warm(paths: list[str]) -> None:
    """Read every file (or every file under a folder) once, into the page cache."""
    for p in paths:
        if os.path.isdir(p):
            warm([os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs])
            continue
        if not os.path.exists(p):
            continue
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


@dataclass
class Case:
    """One child program and how to run it."""

    name: str
    code: str
    args: list[str] = field(default_factory=list)
    warm: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    before: Callable[[], None] | None = None  # e.g. remove an output file
    whole_process: bool = False  # the figure is the process wall time (start-up benchmarks)
    argv: list[str] | None = None  # run this command instead of a Python child program
    results: list[dict[str, float]] = field(default_factory=list)


def run_child(case: Case) -> dict[str, float]:
    """Run one case once in a fresh process; its figures plus ``wall`` and ``rss``."""
    if case.before is not None:
        case.before()
    warm(case.warm)
    env = child_env(case)
    argv = case.argv if case.argv is not None else [PY, "-c", PRELUDE + case.code, *case.args]
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=fo, stderr=fe, env=env)
        # reap it ourselves with wait4: ru_maxrss is then this child's own peak RSS
        # (RUSAGE_CHILDREN would be the largest of every child so far)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        rss = float(ru.ru_maxrss) * 1024
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    if p.returncode != 0:
        raise RuntimeError(f"{case.name} failed ({p.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    # CPU seconds of the whole process (user + system, every thread): on a shared machine
    # far steadier than wall time, which waits for the other jobs' turns on the cores
    res: dict[str, float] = {"wall": wall, "rss": rss, "proc_cpu": ru.ru_utime + ru.ru_stime}
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("BENCH "):
            res.update(json.loads(line[6:]))
    if case.whole_process or "t" not in res:
        res["t"] = wall
    if case.whole_process:
        res["cpu"] = res["proc_cpu"]
    return res


def child_env(case: Case) -> dict[str, str]:
    """The environment every child runs in (this checkout's ``src``, one BLAS thread)."""
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "src"))
    # NumPy's BLAS threads spin for a while after import and charge CPU seconds to a
    # process that does no linear algebra: one thread each, for every case alike
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(k, "1")
    env.update(case.env)
    return env


def count_instructions(case: Case, runs: int) -> list[int]:
    """Instructions one run of ``case`` (a whole-process ``argv`` case) executes, ``runs``
    times, counted by ``valgrind --tool=callgrind``: unlike seconds, the count does not
    move with the machine's load. The hash seed is fixed so that runs repeat exactly.

    Raises:
        RuntimeError: valgrind is missing, or the case fails under it.
    """
    argv = case.argv if case.argv is not None else [PY, "-c", PRELUDE + case.code, *case.args]
    env = child_env(case)
    env["PYTHONHASHSEED"] = "0"
    counts = []
    for _ in range(runs):
        warm(case.warm)
        try:
            p = subprocess.run(
                ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                capture_output=True,
                text=True,
                env=env,
            )
        except FileNotFoundError:
            raise RuntimeError("instruction counts need valgrind") from None
        found = [line for line in p.stderr.splitlines() if "Collected :" in line]
        if p.returncode != 0 or not found:
            raise RuntimeError(f"{case.name} failed under valgrind ({p.returncode}):\n{p.stderr[-3000:]}")
        counts.append(int(found[-1].rsplit(":", 1)[1]))
    return counts


@dataclass
class Ratio:
    label: str
    a: str
    b: str
    goal: float | None
    key: str
    better: str  # "lower" (a/b <= goal) or "higher" (b/a >= goal)
    note: str = ""


class Harness:
    """Collect cases, run them interleaved for ``rounds`` rounds (after ``warmup`` untimed
    ones), and report medians and ratios."""

    def __init__(self, rounds: int = 5, warmup: int = 1, verbose: bool = True, alternate: bool = True) -> None:
        self.rounds = rounds
        self.warmup = warmup
        self.verbose = verbose
        self.alternate = alternate  # the four-round cycle of orders (module docstring)
        self.cases: dict[str, Case] = {}
        self.ratios: list[Ratio] = []
        self.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def case(self, name: str, code: str = "", **kw: Any) -> Case:
        c = Case(name, code, **kw)
        self.cases[name] = c
        return c

    def ratio(
        self, label: str, a: str, b: str, *, goal: float | None = None, key: str = "t", better: str = "lower", note: str = ""
    ) -> None:
        """Report ``a / b`` (``better="lower"``: goal is a maximum) or ``b / a``
        (``better="higher"``: ``a`` is that many times faster than ``b``; goal a minimum)."""
        self.ratios.append(Ratio(label, a, b, goal, key, better, note))

    def run(self) -> None:
        for r in range(self.warmup + self.rounds):
            order = self.order(r - self.warmup)
            for c in order:
                res = run_child(c)
                if r >= self.warmup:
                    c.results.append(res)
                if self.verbose:
                    tag = "warm-up" if r < self.warmup else f"round {r - self.warmup + 1}"
                    print(f"  [{tag}] {c.name}: {res['t']:.3f} s, {res['rss'] / 2**20:.0f} MiB", file=sys.stderr, flush=True)

    def order(self, r: int) -> list[Case]:
        """The cases in round ``r``'s order (0 = the first timed round; warm-up rounds
        are negative): the four-round cycle of the module docstring."""
        order = list(self.cases.values())
        if not self.alternate:
            return order
        if (r // 2) % 2:  # rounds 2 and 3 of the cycle: each declared pair swapped
            for i in range(0, len(order) - 1, 2):
                order[i], order[i + 1] = order[i + 1], order[i]
        if r % 2:
            order.reverse()
        return order

    def median(self, name: str, key: str = "t") -> float:
        return statistics.median(r[key] for r in self.cases[name].results)

    def ratio_value(self, rt: Ratio) -> float:
        a, b = self.cases[rt.a].results, self.cases[rt.b].results
        per = [(x[rt.key] / y[rt.key]) if rt.better == "lower" else (y[rt.key] / x[rt.key]) for x, y in zip(a, b, strict=False)]
        return statistics.median(per)

    def ratio_of_mins(self, rt: Ratio) -> float:
        """The ratio of the two cases' fastest rounds: what is left when the noise, which
        on this VM only ever adds time (host faults, other tenants), is taken out. Shown
        beside the median ratio; the goals are judged on the median."""
        a = min(r[rt.key] for r in self.cases[rt.a].results)
        b = min(r[rt.key] for r in self.cases[rt.b].results)
        return a / b if rt.better == "lower" else b / a

    def met(self, rt: Ratio) -> bool | None:
        if rt.goal is None:
            return None
        v = self.ratio_value(rt)
        return v <= rt.goal if rt.better == "lower" else v >= rt.goal

    @staticmethod
    def machine() -> str:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        cpu = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        try:
            load = "load average %.1f %.1f %.1f" % os.getloadavg()
        except OSError:
            load = ""
        return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {load}"

    def markdown(self) -> str:
        """The cases and ratios as Markdown tables."""
        out = [f"Run {self.started}; {self.machine()}; {self.rounds} rounds (+{self.warmup} warm-up), medians.", ""]
        out.append("| case | seconds (median) | min | max | CPU seconds (median) | peak RSS MiB |")
        out.append("|---|---|---|---|---|---|")
        for c in self.cases.values():
            ts = [r["t"] for r in c.results]
            cpu = [r["cpu"] for r in c.results if "cpu" in r]
            cpu_s = f"{statistics.median(cpu):.3f}" if cpu and len(cpu) == len(ts) else ""
            rss = statistics.median(r["rss"] for r in c.results) / 2**20
            out.append(f"| {c.name} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} | {cpu_s} | {rss:.0f} |")
        out += ["", "| ratio | value | goal | met | fastest rounds' ratio |", "|---|---|---|---|---|"]
        for rt in self.ratios:
            v = self.ratio_value(rt)
            vmin = self.ratio_of_mins(rt)
            op = "a/b" if rt.better == "lower" else "b/a"
            goal = "" if rt.goal is None else ("<= " if rt.better == "lower" else ">= ") + f"{rt.goal:g}"
            m = self.met(rt)
            mark = "" if m is None else ("yes" if m else "**no**")
            out.append(
                f"| {rt.label} ({rt.a} vs {rt.b}, {op}{', ' + rt.key if rt.key != 't' else ''}) | {v:.2f}x | {goal} | {mark} "
                f"| {vmin:.2f}x |"
            )
        return "\n".join(out)

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(
                {
                    "started": self.started,
                    "machine": self.machine(),
                    "cases": {k: c.results for k, c in self.cases.items()},
                    "ratios": [
                        {"label": r.label, "a": r.a, "b": r.b, "goal": r.goal, "value": self.ratio_value(r), "better": r.better}
                        for r in self.ratios
                    ],
                },
                f,
                indent=1,
            )

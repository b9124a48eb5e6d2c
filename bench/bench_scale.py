"""Scale curves: listing, eager-read and DCP consolidation cost per tensor, 1,000 to 1,000,000 tensors.

The one command (issue 12's scale curves; bench/RESULTS.md, "Scale curves, seventh pass")::

    python bench/bench_scale.py --dcp --md bench/_data/scale.md

runs 1k, 10k, 100k and 1M tensors, 3 rounds (+1 warm-up) below 1M and 1 round (no
warm-up) at 1M, and writes the tables to ``--md`` after each size (so a run stopped at 1M
keeps the smaller sizes). On the shared 2-core VM (load average 5-9) it took 7 minutes
with the fixtures in place (1k: 0.5, 10k: 1.1, 100k: 1.4, 1M: 3 minutes, plus about 2
for the 1M consolidation where it runs) and about 9 minutes more the first time (the
fixtures: 1.4 minutes at 100k, 8.5 at 1M); peak RSS 3.5 GiB (the 1M consolidation).
Other options: ``--counts``, ``--rounds``/``--warmup`` (below ``--big``),
``--big``/``--big-rounds``/``--big-warmup``, ``--torch-max`` (dcp.save fixtures and
``dcp_to_torch_save`` timings up to that many tensors), ``--data``.

Fixtures (generated with torch on first use into bench/_data/, not committed):
``scale_<n>/``: ``n`` tiny float32 tensors of 16 elements saved by ``torch.save``, and the
same as safetensors (the per-tensor yardstick); with ``--dcp``, a single-rank DCP checkpoint
of ``n`` float32 tensors of 16 to 256 elements (bench/bench_dcp_scale.py: ``dcp.save`` up to
``--torch-max`` tensors, above it its fast generator, which writes the same bytes and is
checked against ``dcp.save`` at 1,000 tensors at the start of every run that uses it).
Cases, each in a fresh process by bench/harness.py: ``torchless.open`` +
names/dtypes/shapes, ``torchless.load(mmap=False)`` + every tensor's bytes, safetensors'
``safe_open`` listing, and with ``--dcp`` the consolidation of the DCP checkpoint to .pt
by torchless (and by ``dcp_to_torch_save`` up to ``--torch-max``), the DCP cases in rounds
of their own (a case that fails is reported in the tables, the other curves go on). The
tables give the medians divided by ``n``, CPU seconds first (the timed operation's, every
thread: steady on a shared machine): flat rows mean a cost linear in the number of tensors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dcp_scale  # noqa: E402
from bench_many import CODE  # noqa: E402
from harness import PY, ROOT, Harness  # noqa: E402

GEN = r"""
import os, sys, torch
from safetensors.torch import save_file
n, d = int(sys.argv[1]), sys.argv[2]
base = torch.arange(16, dtype=torch.float32)
sd = {f"layers.{i // 100}.experts.{i % 100}.w": base + i for i in range(n)}
torch.save(sd, f"{d}/scale.pt.tmp")
save_file(sd, f"{d}/scale.safetensors.tmp")
os.replace(f"{d}/scale.pt.tmp", f"{d}/scale.pt")
os.replace(f"{d}/scale.safetensors.tmp", f"{d}/scale.safetensors")  # last: it marks the fixture done
"""


def tables(h: Harness) -> str:
    """The harness's tables, less an empty ratio table."""
    md = h.markdown()
    return md if h.ratios else md.split("\n\n| ratio |")[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1000,10000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--big", type=int, default=1000000, help="sizes from this many tensors on run --big-rounds")
    ap.add_argument("--big-rounds", type=int, default=1)
    ap.add_argument("--big-warmup", type=int, default=0)
    ap.add_argument("--dcp", action="store_true", help="also time DCP consolidation (bench_dcp_scale.py's cases)")
    ap.add_argument("--torch-max", type=int, default=10000, help="dcp.save fixtures and dcp_to_torch_save up to this many")
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    os.makedirs(a.data, exist_ok=True)
    checked = bench_dcp_scale.check_fast_fixture() if a.dcp and max(counts) > a.torch_max else ""
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cpu_rows: list[str] = []
    other_rows: list[str] = []
    runs: list[str] = []
    failures: list[str] = []
    for n in counts:
        t0 = time.perf_counter()
        d = os.path.join(a.data, f"scale_{n}")
        os.makedirs(d, exist_ok=True)
        pt, st = os.path.join(d, "scale.pt"), os.path.join(d, "scale.safetensors")
        if not os.path.exists(st):
            print(f"generating {d} ...", file=sys.stderr, flush=True)
            subprocess.run([PY, "-c", GEN, str(n), d], check=True)
        dc = bench_dcp_scale.fixture(a.data, n, a.torch_max) if a.dcp else None
        t1 = time.perf_counter()
        big = n >= a.big
        rounds, warmup = (a.big_rounds, a.big_warmup) if big else (a.rounds, a.warmup)
        h = Harness(rounds=rounds, warmup=warmup)
        h.case(f"list_{n}", CODE["torchless_list"], args=[pt], warm=[pt])
        h.case(f"read_{n}", CODE["torchless_read"], args=[pt], warm=[pt])
        h.case(f"safetensors_list_{n}", CODE["safetensors_list"], args=[st], warm=[st])
        # the DCP cases in their own rounds: one that fails (a limit of the reader, say) is
        # reported in the tables and does not cost the other curves
        hd = Harness(rounds=rounds, warmup=warmup)
        out = os.path.join(a.data, f"scale_{n}_consolidated.pt")
        if dc is not None:
            hd.case(f"dcp_{n}", bench_dcp_scale.CODE["torchless_dcp"], args=[dc, out], warm=[dc])
            if n <= a.torch_max:
                hd.case(f"torch_dcp_{n}", bench_dcp_scale.CODE["torch_dcp_to_torch_save"], args=[dc, out], warm=[dc])
                hd.ratio(f"DCP consolidate, {n} tensors, CPU time", f"dcp_{n}", f"torch_dcp_{n}", better="higher", key="cpu")
        print(f"{n:,} tensors: {warmup} warm-up + {rounds} rounds ...", file=sys.stderr, flush=True)
        h.run()
        failed = ""
        if hd.cases:
            try:
                hd.run()
            except RuntimeError as e:  # the case's name, exit status and stderr's tail
                lines = str(e).strip().splitlines()
                failed = f"{lines[0]} {lines[-1]}"
                print(f"DCP cases at {n:,} tensors: {failed}", file=sys.stderr, flush=True)
                failures.append(f"At {n:,} tensors the DCP cases failed: `{failed}`.")
            finally:
                if os.path.exists(out):
                    os.unlink(out)
        t2 = time.perf_counter()

        def pick(
            k: str, key: str, scale: float, fmt: str, n: int = n, h: Harness = h, hd: Harness = hd, bad: str = failed
        ) -> str:
            name = f"{k}_{n}"
            hh = h if name in h.cases else hd if name in hd.cases else None
            if hh is None:
                return "-"
            if bad and hh is hd:
                return "failed"
            return format(hh.median(name, key) * scale, fmt)

        def cpu(k: str, n: int = n) -> str:
            return pick(k, "cpu", 1e6 / n, ".1f")

        def wall(k: str, n: int = n) -> str:
            return pick(k, "t", 1e6 / n, ".0f")

        def rss(k: str) -> str:
            return pick(k, "rss", 2**-20, ",.0f")

        mb = os.path.getsize(pt) / 1e6
        dmb = f"{bench_dcp_scale.dir_size(dc) / 1e6:,.1f}" if dc else "-"
        cpu_rows.append(
            f"| {n:,} | {h.rounds} | {cpu('list')} | {cpu('read')} | {cpu('dcp')} "
            f"| {cpu('safetensors_list')} | {cpu('torch_dcp')} |"
        )
        other_rows.append(
            f"| {n:,} | {mb:,.1f} / {dmb} | {wall('list')} / {wall('read')} / {wall('dcp')} "
            f"| {rss('list')} / {rss('read')} / {rss('dcp')} | {rss('safetensors_list')} / {rss('torch_dcp')} "
            f"| {(t1 - t0) / 60:.1f} / {(t2 - t1) / 60:.1f} |"
        )
        runs.append("\n\n".join([f"### {n:,} tensors", tables(h), *([tables(hd)] if hd.cases and not failed else [])]))
        md = "\n".join(
            [
                f"Command: `python bench/bench_scale.py {' '.join(sys.argv[1:])}`; started {start}.",
                "",
                "CPU microseconds per tensor (median CPU seconds of the timed operation / tensors):",
                "",
                "| tensors | rounds | list | eager read | DCP consolidate | safetensors listing | dcp_to_torch_save |",
                "|---|---|---|---|---|---|---|",
                *cpu_rows,
                "",
                "Sizes, wall time per tensor, peak RSS and how long each size took:",
                "",
                "| tensors | .pt MB / DCP MB | wall us/tensor: list / read / consolidate "
                "| peak RSS MiB: list / read / consolidate | peak RSS MiB: safetensors listing / dcp_to_torch_save "
                "| minutes: fixtures / timed runs |",
                "|---|---|---|---|---|---|",
                *other_rows,
                "",
                *([checked + ".", ""] if checked else []),
                *[f + "\n" for f in failures],
                "\n\n".join(runs),
            ]
        )
        print(md if n == counts[-1] else runs[-1], flush=True)
        if a.md:
            with open(a.md, "w") as f:
                f.write(md + "\n")


if __name__ == "__main__":
    main()

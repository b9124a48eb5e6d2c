#!/usr/bin/env python3
"""Differential fuzzing of torchless's pickle model against CPython's real unpicklers.

Each generated stream (tests/pickle/pickle_gen.py) is run by the scanner's symbolic
engine (torchless.scan.analysis) and by CPython's C unpickler with inert, recording
hooks (torchless.scan.engine) through every reader path the loaders use (bytes,
io.BytesIO, a buffered file, a zip member), and by the pure-Python unpickler (joblib's).
A stream whose records differ is a divergence; divergences are printed with their bytes.

    python scripts/fuzz_pickle.py --streams 1000000 --seed 1 --jobs 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "pickle"))

from pickle_gen import register_extensions, stream  # noqa: E402

from torchless.scan.differential import check_stream  # noqa: E402
from torchless.scan.engine import READERS  # noqa: E402


def limit_memory(gib: float = 1.5) -> None:
    """Cap this process's address space: the real unpickler allocates what a stream asks
    for (a memo index of 2**30 makes CPython allocate an 8 GiB array)."""
    import resource

    lim = int(gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


def _work(args: tuple[int, int, int]) -> tuple[int, list[tuple[int, str, bytes]], dict[str, int]]:
    seed, first, count = args
    limit_memory()
    register_extensions()
    warnings.simplefilter("ignore")
    bad: list[tuple[int, str, bytes]] = []
    stats: dict[str, int] = {}
    for i in range(first, first + count):
        r = random.Random(f"{seed}:{i}")
        data = stream(r)
        problems, st = check_stream(data)
        for k, v in st.items():
            stats[k] = stats.get(k, 0) + v
        for p in problems:
            bad.append((i, p, data))
    return count, bad, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2000)
    a = ap.parse_args(argv)
    t0 = time.time()
    tasks = [(a.seed, s, min(a.chunk, a.streams - s)) for s in range(0, a.streams, a.chunk)]
    done = 0
    divergences = 0
    stats: dict[str, int] = {}
    it = mp.Pool(a.jobs).imap_unordered(_work, tasks) if a.jobs > 1 else map(_work, tasks)
    for count, bad, st in it:
        done += count
        for k, v in st.items():
            stats[k] = stats.get(k, 0) + v
        for i, p, data in bad:
            divergences += 1
            if divergences <= 50:
                print(f"DIVERGENCE stream {i}: {p}\n  {data!r}", flush=True)
        if done % (a.chunk * 10) == 0 or done == a.streams:
            print(f"{done} streams, {divergences} divergences, {time.time() - t0:.0f} s", flush=True)
    dt = time.time() - t0
    print(
        f"RESULT streams={done} seed={a.seed} divergences={divergences} "
        f"wall_s={dt:.0f} readers={','.join(READERS)}+python stats={stats}"
    )
    return 1 if divergences else 0


if __name__ == "__main__":
    sys.exit(main())

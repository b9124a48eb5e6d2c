"""Long open-world differential runs of the tensor writers against the real readers (issue 31).

    PYTHONPATH=src python scripts/fuzz_writers.py --cases 2000 [--start 0]

Each case (``tests/writers_fuzz.py``) is a random dict of torch tensors written by
``torchless.write_tensors`` and by ``torchless.convert`` from a ``torch.save`` file to
``.safetensors``, a sharded safetensors set, ``.npz`` and ``.pt``, and read back by
safetensors, numpy and torch. Prints the counts docs/robustness.md records and every
failing seed (replay one with ``python tests/writers_fuzz.py SEED``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import writers_fuzz  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--start", type=int, default=0)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    stats = writers_fuzz.Stats()
    failed: list[tuple[int, str]] = []
    t0 = time.monotonic()
    for seed in range(args.start, args.start + args.cases):
        try:
            writers_fuzz.run_case(seed, stats)
        except Exception as e:  # noqa: BLE001 - every failure is reported with its seed
            failed.append((seed, f"{type(e).__name__}: {str(e)[:200]}"))
    dt = time.monotonic() - t0
    print(f"{stats.cases} cases in {dt:.0f} s: {stats.writes} writes read back by the real tools, {stats.refusals} refusals")
    print(f"  writes by destination: {stats.by_dest}")
    print(f"  compared with the real writer's file: {stats.compared_with_real_writer}")
    print(f"  refusals by reason: {stats.refusals_by_reason}")
    print(f"  failed: {len(failed)}")
    for seed, msg in failed[:50]:
        print(f"  seed {seed}: {msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

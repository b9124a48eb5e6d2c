"""Remote reads and reshard throughput: local files against an S3 server on 127.0.0.1.

Usage: python bench/bench_remote.py [--mb 256] [--rounds 3] [--md FILE]

A DCP checkpoint of ``--mb`` MB (float32, 4 ranks, written by torchless from random data)
is kept in bench/_data/ and uploaded to moto's standalone S3 server, started here on a
free 127.0.0.1 port (the `test` extra installs it). Cases, each in a fresh process through
bench/harness.py:

* ``read_local`` / ``read_s3``: assemble every tensor (``numpy()``) from the local folder /
  from ``s3://``: the remote reader's throughput against the page cache;
* ``reshard_local`` / ``reshard_s3``: reshard 4 -> 3 ranks, local to local / S3 to S3;
* ``reshard_local1`` / ``reshard_local2`` / ``reshard_dask2``: reshard 4 -> 3 ranks, local
  to local, as range tasks of ``--max-task-bytes`` on the local executor (1 process, 2
  processes) and on a Dask ``LocalCluster`` of 2 worker processes (started before the
  clock, as an existing cluster would be);
* ``plan_1tb``: ``reshard --plan-only`` of a synthetic 1 TB, 1,024-rank checkpoint onto 768.

The figures are one machine's; moto keeps objects in its own process memory, so S3 here
measures the protocol and client overheads (HTTP, signing, copies), not a network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, Harness  # noqa: E402

READ = r"""
import torchless, torchless.dcp
t0 = time.perf_counter()
n = 0
art = torchless.open(P)
for name, t in art.tensors():
    n += t.numpy().nbytes
dt = time.perf_counter() - t0
done(dt, mb_s=n / dt / 1e6)
"""

RESHARD = r"""
import torchless.dcp, os
from torchless.io import remote
dst = ARGS[1]
t0 = time.perf_counter()
torchless.dcp.reshard(P, dst, 3)
dt = time.perf_counter() - t0
done(dt, mb_s=float(ARGS[2]) / dt / 1e6)
"""

RESHARD_EX = r"""
import torchless.dcp
dst, nbytes, ex, mtb = ARGS[1], float(ARGS[2]), ARGS[3], int(ARGS[4]) or None
executor = ex
if ex.startswith("dask"):  # a LocalCluster started before the clock: an existing cluster's case
    import distributed
    cluster = distributed.LocalCluster(
        n_workers=int(ex[4:]), processes=True, threads_per_worker=1, dashboard_address=None, silence_logs=50
    )
    executor = distributed.Client(cluster)
    executor.run(lambda: __import__("torchless.jobs.tasks"))
t0 = start()
res = torchless.dcp.reshard(P, dst, 3, executor=executor, max_task_bytes=mtb)
dt = time.perf_counter() - t0
done(dt, mb_s=nbytes / dt / 1e6, tasks=res["tasks"])
"""

PLAN = r"""
from torchless.formats.dcp.plan import plan, synthetic
t0 = time.perf_counter()
res = plan(synthetic(10**12, 1024), 768)
dt = time.perf_counter() - t0
done(dt, balance=res["balance"])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None)
    ap.add_argument("--cases", default="", help="comma-separated case names to run (default: all)")
    ap.add_argument("--max-task-bytes", type=int, default=32 << 20, help="for the executor cases")
    a = ap.parse_args()

    import boto3
    import numpy as np
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, os.path.join(ROOT, "src"))
    import torchless
    import torchless.dcp

    src = os.path.join(a.data, f"remote_dcp_{a.mb}")
    nbytes = a.mb * 10**6
    if not os.path.exists(os.path.join(src, ".metadata")):
        os.makedirs(a.data, exist_ok=True)
        rng = np.random.default_rng(0)
        per = nbytes // 16 // 4
        arrs = {f"layers.{i}.weight": rng.standard_normal((per // 1024, 1024), dtype=np.float32) for i in range(16)}
        pt = os.path.join(a.data, f"remote_{a.mb}.safetensors")
        torchless.save(arrs, pt)
        torchless.dcp.reshard(pt, src, 4)
        os.remove(pt)
    port = _free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    os.environ.update(env)
    tmp = tempfile.mkdtemp(prefix="tl-bench-remote-")
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="bench")
        for n in os.listdir(src):
            s3.upload_file(os.path.join(src, n), "bench", f"src/{n}")

        def clear_local() -> None:
            shutil.rmtree(os.path.join(tmp, "out"), ignore_errors=True)

        def clear_s3() -> None:
            for o in s3.list_objects_v2(Bucket="bench", Prefix="out/").get("Contents", []):
                s3.delete_object(Bucket="bench", Key=o["Key"])

        h = Harness(rounds=a.rounds, warmup=a.warmup)
        h.case("read_local", READ, args=[src], warm=[src], env=env)
        h.case("read_s3", READ, args=["s3://bench/src"], env=env)
        h.case(
            "reshard_local", RESHARD, args=[src, os.path.join(tmp, "out"), str(nbytes)], warm=[src], env=env, before=clear_local
        )
        h.case("reshard_s3", RESHARD, args=["s3://bench/src", "s3://bench/out", str(nbytes)], env=env, before=clear_s3)
        out = os.path.join(tmp, "out")
        mtb = str(a.max_task_bytes)
        for name, ex in (("reshard_local1", "local:1"), ("reshard_local2", "local:2"), ("reshard_dask2", "dask2")):
            h.case(name, RESHARD_EX, args=[src, out, str(nbytes), ex, mtb], warm=[src], env=env, before=clear_local)
        h.case("plan_1tb", PLAN, env=env)
        h.ratio("remote read, S3 vs local", "read_s3", "read_local")
        h.ratio("reshard, S3 to S3 vs local", "reshard_s3", "reshard_local")
        h.ratio("reshard, 2 Dask workers vs local executor (1 process)", "reshard_dask2", "reshard_local1")
        h.ratio("reshard, 2 Dask workers vs 2 local processes", "reshard_dask2", "reshard_local2")
        if a.cases:
            keep = set(a.cases.split(","))
            h.cases = {k: v for k, v in h.cases.items() if k in keep}
            h.ratios = [r for r in h.ratios if r.a in keep and r.b in keep]
        h.run()
        md = h.markdown()
        md += "\n\n| case | MB/s (median) |\n|---|---|\n"
        for name in ("read_local", "read_s3", "reshard_local", "reshard_s3", "reshard_local1", "reshard_local2", "reshard_dask2"):
            if name in h.cases:
                md += f"| {name} | {h.median(name, 'mb_s'):.0f} |\n"
        if "plan_1tb" in h.cases:
            md += f"\nplan_1tb balance (largest task / mean): {h.median('plan_1tb', 'balance'):.4f}\n"
        print(md)
        if a.md:
            with open(a.md, "a") as f:
                f.write(md + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        srv.stop()


if __name__ == "__main__":
    main()

"""Remote reads and reshard throughput: local files against an S3 server on 127.0.0.1.

Usage: python bench/bench_remote.py [--mb 256] [--rounds 3] [--md FILE]

A DCP checkpoint of ``--mb`` MB (float32, 4 ranks, written by torchless from random data)
is kept in bench/_data/ and uploaded to moto's standalone S3 server, started here on a
free 127.0.0.1 port (the `test` extra installs it). Cases, each in a fresh process through
bench/harness.py:

* ``read_local`` / ``read_s3``: assemble every tensor (``numpy()``) from the local folder /
  from ``s3://``: the remote reader's throughput against the page cache;
* ``reshard_local`` / ``reshard_s3``: reshard 4 -> 3 ranks, local to local / S3 to S3;
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
from torchless.core import remote
dst = ARGS[1]
t0 = time.perf_counter()
torchless.dcp.reshard(P, dst, 3)
dt = time.perf_counter() - t0
done(dt, mb_s=float(ARGS[2]) / dt / 1e6)
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
        h.case("plan_1tb", PLAN, env=env)
        h.ratio("remote read, S3 vs local", "read_s3", "read_local")
        h.ratio("reshard, S3 to S3 vs local", "reshard_s3", "reshard_local")
        h.run()
        md = h.markdown()
        md += "\n\n| case | MB/s (median) |\n|---|---|\n"
        for name in ("read_local", "read_s3", "reshard_local", "reshard_s3"):
            md += f"| {name} | {h.median(name, 'mb_s'):.0f} |\n"
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

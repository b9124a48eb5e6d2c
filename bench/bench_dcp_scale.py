"""DCP consolidation time per tensor against the number of tensors (issue 12's scale curve).

Usage: python bench/bench_dcp_scale.py [--ns 1000,10000,100000,1000000] [--rounds N] [--torch-max 10000]
                                      [--data DIR] [--md FILE]
       python bench/bench_dcp_scale.py --check-fixture 1000   # the fast generator's proof, alone

For each n, a single-rank DCP checkpoint of n small float32 tensors (16 to 256 elements,
so per-tensor work, not bandwidth, is what is measured) is generated on first use into
bench/_data/, then consolidated to .pt by torchless and (for n up to ``--torch-max``) by
``dcp_to_torch_save`` in the same rounds, through bench/harness.py. The table gives the
medians and the microseconds per tensor; a flat column means a cost linear in the number
of tensors. ``bench/bench_scale.py --dcp`` runs these cases with the listing and
eager-read curves (the one command of bench/RESULTS.md's scale sections).

Fixtures: up to ``--torch-max`` tensors ``dcp.save`` writes them (``dcp_scale_<n>/``);
above it the fast generator does (``dcp_scale_<n>_fast/``): ``dcp.save`` costs about
320 us of CPU a tensor (100,000 tensors: 32 CPU s, 1 min 44 s at load 5), so 1,000,000
take from several minutes to most of an hour on a shared 2-core machine; the fast
generator about 160-190 us. It writes what ``dcp.save(sd, no_dist=True)`` writes, with
torch's own pieces and without the save planner: each tensor by ``torch.save`` into
``__0_0.distcp`` in state-dict order (as ``FileSystemWriter`` does on one rank), and
``.metadata`` as ``pickle.dump`` of torch's own ``Metadata`` classes (as
``FileSystemWriter.finish`` does). :func:`check_fast_fixture`, run first whenever a size
above ``--torch-max`` is measured (fixtures generated or not), proves it at 1,000
tensors against ``dcp.save`` of the same state dict: the same ``.metadata`` bytes (but
for the save id and the folder name), the same items at the same offsets with the same
zip members (but for the random serialization id ``torch.save`` draws per item),
torchless consolidating both to identical tensors, and torch's own ``dcp_to_torch_save``
(DCP's loader) loading the fast fixture to those tensors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Harness  # noqa: E402

#: the consolidation, timed in wall and CPU seconds (CPU time of the process: less
#: sensitive to other jobs on a shared machine)
CODE = {
    "torchless_dcp": """
import os
import torchless.formats.registry as reg
from torchless.formats.dcp.consolidate import consolidate
reg.handlers()  # import-time work, outside the timing like the yardstick's imports
c, t = time.process_time(), time.perf_counter()
consolidate(ARGS[0], ARGS[1])
done(time.perf_counter() - t, cpu=time.process_time() - c)
os.unlink(ARGS[1])
""",
    "torch_dcp_to_torch_save": """
import os, warnings
warnings.simplefilter("ignore")
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
c, t = time.process_time(), time.perf_counter()
dcp_to_torch_save(ARGS[0], ARGS[1])
done(time.perf_counter() - t, cpu=time.process_time() - c)
os.unlink(ARGS[1])
""",
}

#: the state dict of n tensors (argv: n, folder), the same for both generators
STATE = r"""
import sys, warnings, torch
n, d = int(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(0)
sizes = torch.randint(16, 257, (n,), generator=g).tolist()
sd = {f"blocks.{i // 10}.p{i % 10}.weight": torch.randn(k, generator=g) for i, k in enumerate(sizes)}
"""

#: torch's DCP writer
GEN = (
    STATE
    + r"""
import torch.distributed.checkpoint as dcp
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save(sd, checkpoint_id=d, no_dist=True)
"""
)

#: the fast generator: what FileSystemWriter writes on one rank, by torch's own
#: torch.save and pickle.dump, without the save planner (see the module doc)
GEN_FAST = (
    STATE
    + r"""
import os, pickle, uuid
from pathlib import Path
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta, TensorProperties, TensorStorageMetadata,
)
os.makedirs(d, exist_ok=True)
sdm, storage = {}, {}
with open(os.path.join(d, "__0_0.distcp"), "wb") as f:
    for fqn, t in sd.items():
        off = f.tell()
        torch.save(t, f)
        chunk = ChunkStorageMetadata(offsets=torch.Size([0] * t.dim()), sizes=t.size())
        sdm[fqn] = TensorStorageMetadata(properties=TensorProperties.create_from_tensor(t), size=t.size(), chunks=[chunk])
        storage[MetadataIndex(fqn, chunk.offsets, 0)] = _StorageInfo("__0_0.distcp", off, f.tell() - off)
md = Metadata(
    state_dict_metadata=sdm,
    planner_data={k: (k,) for k in sd},
    storage_data=storage,
    storage_meta=StorageMeta(checkpoint_id=Path(d), save_id=str(uuid.uuid4())),
    version=CURRENT_DCP_VERSION,
)
with open(os.path.join(d, ".metadata.tmp"), "wb") as f:
    pickle.dump(md, f)
os.replace(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))
"""
)

#: the proof (argv: the dcp.save folder, the fast one, n, a scratch folder)
CHECK = r"""
import io, os, pickle, sys, warnings, zipfile, torch
warnings.simplefilter("ignore")
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torchless.formats.dcp.consolidate import consolidate
ref, fast, n, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def fail(msg):
    sys.exit("fast DCP fixture check failed: " + msg)
mr, mf = FileSystemReader(ref).read_metadata(), FileSystemReader(fast).read_metadata()
# .metadata: byte for byte, once the fast one's save id and folder name are torch's
raw_r, raw_f = (open(os.path.join(p, ".metadata"), "rb").read() for p in (ref, fast))
sid_r, sid_f = mr.storage_meta.save_id.encode(), mf.storage_meta.save_id.encode()
name_r, name_f = os.path.basename(ref).encode(), os.path.basename(fast).encode()
if raw_f.replace(sid_f, sid_r).replace(name_f, name_r) != raw_r:
    fail(".metadata differs from dcp.save's beyond the save id and the folder name")
# .distcp: the same items at the same offsets, tiling the file; in each, the same zip
# members at the same places with the same bytes, but for torch.save's random serialization id
blob_r, blob_f = (open(os.path.join(p, "__0_0.distcp"), "rb").read() for p in (ref, fast))
if len(blob_r) != len(blob_f):
    fail(f"__0_0.distcp is {len(blob_f)} bytes, dcp.save's {len(blob_r)}")
end = 0
for idx, info in sorted(mr.storage_data.items(), key=lambda kv: kv[1].offset):
    if info.offset != end:
        fail(f"items do not tile __0_0.distcp at offset {end}")
    end = info.offset + info.length
    za, zb = (zipfile.ZipFile(io.BytesIO(b[info.offset:end])) for b in (blob_r, blob_f))
    for a, b in zip(za.infolist(), zb.infolist(), strict=True):
        if (a.filename, a.header_offset, a.file_size) != (b.filename, b.header_offset, b.file_size):
            fail(f"item {idx.fqn}: zip member {a.filename} differs in place or size")
        if not a.filename.endswith(".data/serialization_id") and za.read(a) != zb.read(b):
            fail(f"item {idx.fqn}: zip member {a.filename} differs")
if end != len(blob_r):
    fail("items do not cover __0_0.distcp")
# torchless consolidates both to the same tensors
for src, out in ((ref, "tl_ref.pt"), (fast, "tl_fast.pt")):
    consolidate(src, os.path.join(tmp, out))
a, b = (torch.load(os.path.join(tmp, p)) for p in ("tl_ref.pt", "tl_fast.pt"))
def same(x, y):
    return list(x) == list(y) and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)
if len(a) != n or not same(a, b):
    fail("torchless consolidates it to other tensors than the dcp.save fixture")
# torch's own DCP loader reads the fast fixture to the same tensors
dcp_to_torch_save(fast, os.path.join(tmp, "torch_fast.pt"))
dcp_to_torch_save(ref, os.path.join(tmp, "torch_ref.pt"))
c, r = (torch.load(os.path.join(tmp, p)) for p in ("torch_fast.pt", "torch_ref.pt"))
if not (same(c, r) and same(c, a)):
    fail("torch's dcp_to_torch_save loads it to other tensors than the dcp.save fixture")
print(f"fast DCP fixture check at {n} tensors: ok (same .metadata bytes but for the save id and folder, "
      f"same {len(mr.storage_data)} items and zip members but for each serialization id, "
      "same tensors consolidated by torchless and loaded by dcp_to_torch_save)")
"""


def env() -> dict[str, str]:
    """The generators' environment: this checkout's ``src`` (the check imports torchless)."""
    e = dict(os.environ)
    e.setdefault("PYTHONPATH", os.path.join(ROOT, "src"))
    return e


def check_fast_fixture(n: int = 1000) -> str:
    """Prove the fast generator against ``dcp.save`` at ``n`` tensors (a few seconds);
    returns the check's one-line report.

    Raises:
        subprocess.CalledProcessError: the check failed (its message is on stderr).
    """
    with tempfile.TemporaryDirectory(prefix="dcp_fixture_check_") as tmp:
        ref, fast = os.path.join(tmp, "torchgen"), os.path.join(tmp, "fastgen_")
        subprocess.run([PY, "-c", GEN, str(n), ref], check=True, env=env())
        subprocess.run([PY, "-c", GEN_FAST, str(n), fast], check=True, env=env())
        p = subprocess.run([PY, "-c", CHECK, ref, fast, str(n), tmp], check=True, env=env(), stdout=subprocess.PIPE, text=True)
    print(p.stdout.strip(), file=sys.stderr, flush=True)
    return p.stdout.strip()


def fixture(data: str, n: int, torch_max: int) -> str:
    """The DCP folder of ``n`` tensors, generated on first use: by ``dcp.save`` up to
    ``torch_max`` tensors, above it by the fast generator (:func:`check_fast_fixture` runs
    before, at every run that uses it)."""
    fast = n > torch_max
    d = os.path.join(data, f"dcp_scale_{n}" + ("_fast" if fast else ""))
    if not os.path.exists(os.path.join(d, ".metadata")):
        print(f"generating {d} ({'fast generator' if fast else 'dcp.save'}) ...", file=sys.stderr, flush=True)
        subprocess.run([PY, "-c", GEN_FAST if fast else GEN, str(n), d], check=True, env=env())
    return d


def dir_size(d: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--torch-max", type=int, default=10000, help="dcp.save fixtures, dcp_to_torch_save: up to this many")
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None)
    ap.add_argument("--check-fixture", type=int, default=0, metavar="N", help="only check the fast generator at N tensors")
    a = ap.parse_args()
    if a.check_fixture:
        print(check_fast_fixture(a.check_fixture))
        return
    ns = [int(x) for x in a.ns.split(",")]
    checked = check_fast_fixture() if max(ns) > a.torch_max else ""
    h = Harness(rounds=a.rounds, warmup=a.warmup)
    outs = []
    for n in ns:
        d = fixture(a.data, n, a.torch_max)
        out = os.path.join(a.data, f"dcp_scale_{n}.pt")
        outs.append(out)
        h.case(f"torchless_dcp_{n}", CODE["torchless_dcp"], args=[d, out], warm=[d])
        if n <= a.torch_max:
            h.case(f"torch_dcp_{n}", CODE["torch_dcp_to_torch_save"], args=[d, out], warm=[d])
            h.ratio(f"DCP consolidate, {n} tensors", f"torchless_dcp_{n}", f"torch_dcp_{n}", better="higher")
            h.ratio(f"DCP consolidate, {n} tensors, CPU time", f"torchless_dcp_{n}", f"torch_dcp_{n}", better="higher", key="cpu")
    h.run()
    md = h.markdown()
    if checked:
        md += f"\n\n{checked}."
    md += "\n\n| tensors | torchless us/tensor (wall / CPU) | dcp_to_torch_save us/tensor (wall / CPU) |\n|---|---|---|\n"
    for n in ns:

        def per(name: str, n: int = n) -> str:
            if name not in h.cases:
                return "-"
            return f"{h.median(name) / n * 1e6:.1f} / {h.median(name, 'cpu') / n * 1e6:.1f}"

        md += f"| {n:,} | {per(f'torchless_dcp_{n}')} | {per(f'torch_dcp_{n}')} |\n"
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    for out in outs:
        if os.path.exists(out):
            os.unlink(out)


if __name__ == "__main__":
    main()

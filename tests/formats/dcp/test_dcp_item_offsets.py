"""An error in a record of a DCP item other than its payload (``data.pkl``, ``byteorder``,
``version``: each item of a ``.distcp`` file is a small ``torch.save`` archive) names the
``.distcp`` file, the item as member and the absolute offset in the file, as payload
errors do. The item's reader gave offsets in the item and the path ``file@item-offset``
(``dir:fqn`` for a bytes item), so the place named was not where the damage is.

torch writes the checkpoint; where the item lies comes from torch's own metadata reader
and where the record's local header lies in it from Python's zipfile (neither is
torchless). The damage is a wrong local header signature, which zipfile refuses too."""

from __future__ import annotations

import io
import os
import warnings
import zipfile

import pytest

import torchless
from torchless.cli.main import main as cli
from torchless.core.errors import TorchlessError

torch = pytest.importorskip("torch", reason="torch writes the checkpoints (the oracle)")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch.distributed.checkpoint is missing")

#: 20 tensors: more than DCPReader.batch_min, so the chunks are located in batches too
N = 20
VICTIM = "t07"
BYTES = "extra.step"


def _save(d: str) -> None:
    g = torch.Generator().manual_seed(0)
    sd: dict = {f"t{i:02d}": torch.randn(16, 4, generator=g) for i in range(N)}
    sd["extra"] = {"step": 5, "name": "run"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=d, no_dist=True)


def _damage(d: str, fqn: str, record: str) -> tuple[str, int]:
    """Break the local header signature of ``record`` in ``fqn``'s item; returns the
    .distcp path and the header's absolute offset."""
    md = dcp.FileSystemReader(d).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
    path = os.path.join(d, info.relative_path)
    with open(path, "rb") as f:
        f.seek(info.offset)
        item = f.read(info.length)
    z = zipfile.ZipFile(io.BytesIO(item))
    name = next(n for n in z.namelist() if n.endswith("/" + record))
    at = info.offset + z.getinfo(name).header_offset
    with open(path, "r+b") as f:
        f.seek(at + 3)
        f.write(b"\x05")
    with open(path, "rb") as f:
        f.seek(info.offset)
        with pytest.raises(zipfile.BadZipFile):  # the oracle sees the damage there
            zipfile.ZipFile(io.BytesIO(f.read(info.length))).read(name)
    return path, at


@pytest.mark.parametrize(
    ("fqn", "record"), [(VICTIM, "data.pkl"), (VICTIM, "byteorder"), (VICTIM, "version"), (BYTES, "data.pkl")]
)
def test_error_names_the_file_item_and_absolute_offset(fqn, record, tmp_path, capsys):
    d = str(tmp_path / "ck")
    _save(d)
    path, at = _damage(d, fqn, record)

    with pytest.raises(TorchlessError) as ei:
        state = torchless.load(d)
        state[fqn].numpy()
    e = ei.value
    assert (e.path, e.member, e.offset) == (path, fqn, at), str(e)
    assert record in str(e) or record == "data.pkl", str(e)

    out = tmp_path / "one.pt"
    with torchless.open(d) as art, pytest.raises(TorchlessError) as ei:
        art.convert_to(str(out), format="pt")
    assert (ei.value.path, ei.value.member, ei.value.offset) == (path, fqn, at), str(ei.value)

    capsys.readouterr()
    assert cli(["verify", d]) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"[{fqn}] @{at}:" in lines[0] and f"{path}, member {fqn!r}, offset {at}:" in lines[0], lines

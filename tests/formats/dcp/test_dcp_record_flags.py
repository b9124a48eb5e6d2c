"""A DCP item whose payload record carries a flag torch's zip reader refuses (encrypted,
strong encryption) or that is marked as a directory is refused when the chunk is read, as
a ``.pt`` storage record with the same flags is: by ``torchless.load``, consolidate
(``convert``) and ``reshard``, through the API and the CLI, naming the .distcp file, the
record and its entry's absolute offset. (Locating the chunk took the payload's place from
its local header and read it; only ``verify`` noticed.)

torch is the oracle: its DCP load and ``dcp_to_torch_save`` refuse the encrypted records
("unsupported encryption", miniz); a directory record it loads without an error but with
bytes it never read (miniz extracts nothing for a directory), which torchless refuses in a
``.pt`` as well.
"""

from __future__ import annotations

import io
import os
import struct
import warnings
import zipfile

import pytest

import torchless
from torchless.cli.main import main as cli
from torchless.core.errors import TorchlessError, UnsupportedError
from torchless.formats.dcp.reader import DCPReader

torch = pytest.importorskip("torch", reason="torch writes the checkpoints (the oracle)")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch.distributed.checkpoint is missing")

#: how each damage is made: (offset of the field in the central entry, struct format, bits set)
DAMAGE = {
    "encrypted": (8, "<H", 0x1),  # general-purpose flag bit 0
    "strong-encryption": (8, "<H", 0x40),  # bit 6
    "directory": (38, "<I", 0x10),  # external attributes: DOS directory
}
#: 20 tensors: more than DCPReader.batch_min, so consolidate's located in batches
N = 20
VICTIM = "t07"


def _save(d: str) -> dict:
    g = torch.Generator().manual_seed(0)
    sd = {f"t{i:02d}": torch.randn(16, 4, generator=g) for i in range(N)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=d, no_dist=True)
    return sd


def _damage(d: str, how: str) -> tuple[str, int, str]:
    """Set ``how`` on the central entry of VICTIM's payload record; returns the .distcp
    path, the entry's absolute offset and the record name (Python's zipfile finds them)."""
    r = DCPReader(d)
    info = r.chunks(VICTIM)[0].info
    r.close()
    path = os.path.join(d, info.relative_path)
    with open(path, "rb") as f:
        item = f.read()[info.offset : info.offset + info.length]
    z = zipfile.ZipFile(io.BytesIO(item))
    victim = next(n for n in z.namelist() if n.endswith("/data/0"))
    p = z.start_dir
    for _ in z.namelist():
        nlen, xlen, clen = struct.unpack_from("<HHH", item, p + 28)
        if item[p + 46 : p + 46 + nlen].decode() == victim:
            break
        p += 46 + nlen + xlen + clen
    field, fmt, bits = DAMAGE[how]
    (old,) = struct.unpack_from(fmt, item, p + field)
    with open(path, "r+b") as f:
        f.seek(info.offset + p + field)
        f.write(struct.pack(fmt, old | bits))
    return path, info.offset + p, victim


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request, tmp_path):
    d = str(tmp_path / "ck")
    sd = _save(d)
    path, at, record = _damage(d, request.param)
    return request.param, d, sd, path, at, record


def _torch_load(d: str) -> dict:
    out = {f"t{i:02d}": torch.zeros(16, 4) for i in range(N)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, checkpoint_id=d, no_dist=True)
    return out


def _names_it(e: TorchlessError, path: str, at: int, record: str) -> None:
    assert e.path == path and e.member == record and e.offset == at, (e.path, e.member, e.offset)
    assert record in str(e) and f"offset {at}" in str(e) and VICTIM in str(e), str(e)


def _torch_error(fn, *args) -> str:
    """The text of the error torch raises (a CheckpointException, a BaseException,
    carries each rank's exception)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*args)
    except BaseException as e:  # noqa: B036 - CheckpointException derives from BaseException
        causes = getattr(e, "failures", {}) or {}
        return " | ".join([str(e)] + [str(c[0] if isinstance(c, tuple) else c) for c in causes.values()])
    return ""


def test_torch_refuses_the_encrypted_records(damaged, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    how, d, _sd, _path, _at, record = damaged
    load_err = _torch_error(_torch_load, d)
    save_err = _torch_error(dcp_to_torch_save, d, str(tmp_path / "out.pt"))
    if how == "directory":
        # miniz extracts nothing for a directory: torch reads it without an error
        assert load_err == "" and save_err == "", (load_err, save_err)
        return
    for err in (load_err, save_err):
        assert "unsupported encryption" in err and record.split("/", 1)[1] in err, err


def test_api_refuses(damaged, tmp_path):
    _how, d, sd, path, at, record = damaged
    state = torchless.load(d)
    assert (state["t06"].numpy() == sd["t06"].numpy()).all()  # the other items still read
    with pytest.raises(UnsupportedError) as ei:
        state[VICTIM].numpy()
    _names_it(ei.value, path, at, record)

    out = tmp_path / "one.pt"
    with torchless.open(d) as art, pytest.raises(UnsupportedError) as ei:
        art.convert_to(str(out), format="pt")
    _names_it(ei.value, path, at, record)
    assert not out.exists()

    from torchless.formats.dcp.reshard import reshard

    dst = tmp_path / "resharded"
    with pytest.raises(UnsupportedError) as ei:
        reshard(d, str(dst), ranks=2)
    _names_it(ei.value, path, at, record)
    assert not (dst / ".metadata").exists()

    with torchless.open(d) as art:
        probs = [p for p in art.verify() if p.severity == "error"]
    assert [(p.member, p.offset) for p in probs] == [(VICTIM, at)], probs


def test_cli_refuses_in_one_line(damaged, tmp_path, capsys):
    _how, d, _sd, path, at, record = damaged
    for argv in (["convert", d, str(tmp_path / "one.pt")], ["reshard", "--ranks", "2", d, str(tmp_path / "rs")]):
        capsys.readouterr()
        assert cli(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and path in err[0] and record in err[0] and f"offset {at}" in err[0], (argv, err)
    assert not (tmp_path / "one.pt").exists() and not (tmp_path / "rs" / ".metadata").exists()
    assert cli(["verify", d]) == 1
    # info reads the metadata only (no item is opened): the same as on a clean checkpoint
    assert cli(["info", d]) == 0


def test_pt_with_the_same_record_is_refused_the_same_way(damaged, tmp_path):
    """The same archive as a .pt (the item cut out of the .distcp) is refused by torchless
    with the same error class: one rule for both."""
    _how, d, _sd, path, at, record = damaged
    r = DCPReader(d)
    info = r.chunks(VICTIM)[0].info
    r.close()
    with open(path, "rb") as f:
        item = f.read()[info.offset : info.offset + info.length]
    pt = tmp_path / "item.pt"
    pt.write_bytes(item)
    with pytest.raises(UnsupportedError):
        torchless.load(str(pt)).numpy()

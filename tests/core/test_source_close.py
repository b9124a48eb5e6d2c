"""MmapSource.close releases the file: it unmaps at once when nothing holds a view, and
otherwise the last array taken before close unmaps it when dropped (torch's mmap=True
semantics); reads after close raise UsageError. Linux: /proc/self/maps shows mappings."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from torchless.core.dtypes import by_name
from torchless.core.errors import TorchlessError, UsageError
from torchless.core.tensor import Storage, Tensor
from torchless.io.source import MmapSource, is_mapped

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")


def _mapped(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        if any(line.rstrip("\n").endswith(real) for line in f):
            return True
    return any(os.readlink(f"/proc/self/fd/{fd}") == real for fd in os.listdir("/proc/self/fd") if _link(fd))


def _link(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return True


@pytest.fixture
def blob(tmp_path):
    p = tmp_path / "blob.bin"
    values = np.arange(4096, dtype="<f4")
    p.write_bytes(values.tobytes())
    return str(p), values


def test_close_unmaps_when_nothing_holds_a_view(blob):
    path, values = blob
    src = MmapSource(path)
    assert bytes(src.view(0, 8)) == values.tobytes()[:8]
    assert _mapped(path)
    src.close()
    assert not _mapped(path)
    src.close()  # idempotent


@pytest.mark.parametrize(
    "read",
    [
        lambda s: s.view(0, 4),
        lambda s: s.read_at(0, 4),
        lambda s: s.copy(0, 4),
        lambda s: s.searchable(),
    ],
    ids=["view", "read_at", "copy", "searchable"],
)
def test_reads_after_close_raise_usage_error(blob, read):
    path, _ = blob
    src = MmapSource(path)
    src.close()
    with pytest.raises(UsageError, match="closed") as e:
        read(src)
    assert e.value.path == path


def test_arrays_taken_before_close_stay_valid_and_unmap_when_dropped(blob):
    path, values = blob
    src = MmapSource(path)
    arr = np.frombuffer(src.view(0, values.nbytes), dtype="<f4")
    src.close()
    gc.collect()
    assert _mapped(path)  # the array's pages stay mapped while it lives
    np.testing.assert_array_equal(arr, values)
    del arr
    gc.collect()
    assert not _mapped(path)


def test_lazy_tensor_does_not_hold_the_mapping(blob):
    """A storage read through a mapping asks the source each time (no cached view), so
    closing releases the file, an array already taken stays valid, a later read raises."""
    path, values = blob
    src = MmapSource(path)
    f32 = by_name("float32")
    t = Tensor(Storage("0", values.nbytes, f32, loader=lambda: src.view(0, values.nbytes)), f32, values.shape)
    held = t.numpy()
    assert is_mapped(t.storage.bytes()) and not t.storage.loaded
    src.close()
    np.testing.assert_array_equal(held, values)
    with pytest.raises(UsageError, match="closed"):
        t.numpy()
    del held
    gc.collect()
    assert not _mapped(path)


def test_copied_storage_is_kept(blob):
    path, values = blob
    src = MmapSource(path)
    f32 = by_name("float32")
    st = Storage("0", values.nbytes, f32, loader=lambda: src.copy(0, values.nbytes))
    st.bytes()
    assert st.loaded and not is_mapped(st.bytes())
    src.close()
    np.testing.assert_array_equal(Tensor(st, f32, values.shape).numpy(), values)  # in memory of its own
    assert not _mapped(path)
    assert issubclass(UsageError, TorchlessError)


@pytest.mark.parametrize("length", [(4 << 20) - 1, 4 << 20, (9 << 20) + 7])
def test_large_copies_are_the_bytes_at_a_huge_page_boundary(tmp_path, length):
    """Reads of 4 MiB and more land in memory starting at a 2 MiB boundary (so the whole
    buffer can take transparent huge pages); the bytes are the file's either way."""
    rng = np.random.default_rng(3)
    body = rng.integers(0, 256, length + 300, dtype=np.uint8).tobytes()
    p = tmp_path / "big.bin"
    p.write_bytes(body)
    src = MmapSource(str(p))
    mv = src.copy(123, length)
    assert len(mv) == length and bytes(mv) == body[123 : 123 + length]
    arr = np.frombuffer(mv, np.uint8)
    assert not is_mapped(mv)
    if length >= 4 << 20:
        assert arr.ctypes.data % (2 << 20) == 0
    src.close()

"""Grammar fuzzing of the pickle machine: random opcode soups built from torch-checkpoint
atoms and allowlisted globals give a value or a TorchlessError, never anything else."""

from __future__ import annotations

import random

import pytest

from torchless.core.dtypes import DTYPES
from torchless.core.errors import TorchlessError
from torchless.core.tensor import Storage
from torchless.core.tree import describe, iter_tensors
from torchless.pickle.globals import AllowlistResolver
from torchless.pickle.machine import Unpickler
from torchless.pickle.opcodes import OPCODE_NAMES
from torchless.pickle.torch_globals import DEFAULT_ALLOWLIST

GLOBALS = [
    b"__builtin__\nset",
    b"collections\nOrderedDict",
    b"torch._utils\n_rebuild_tensor_v2",
    b"torch\nFloatStorage",
    b"__builtin__\nrange",
    b"__builtin__\nlist",
    b"numpy\ndtype",
    b"numpy.core.multiarray\n_reconstruct",
    b"argparse\nNamespace",
    b"torch\nSize",
    b"_codecs\nencode",
    b"collections\ndefaultdict",
    b"datetime\ndatetime",
    b"decimal\nDecimal",
    b"torch._utils\n_rebuild_parameter",
    b"torch._tensor\n_rebuild_from_type_v2",
    b"torch._utils\n_rebuild_sparse_tensor",
    b"torch._utils\n_rebuild_qtensor",
    b"torch\nper_tensor_affine",
    b"pathlib\nPosixPath",
    b"__builtin__\nslice",
    b"torch\ndevice",
    b"torch.serialization\n_get_layout",
    b"collections\ndeque",
    b"numpy.core.multiarray\nscalar",
    b"foo\nBar",
    b"__builtin__\nbytearray",
    b"__builtin__\ncomplex",
    b"torch._utils\n_rebuild_tensor_v3",
    b"torch\nbfloat16",
    b"torch.storage\nUntypedStorage",
    b"copyreg\n_reconstructor",
    b"__builtin__\nobject",
    b"torch._utils\n_rebuild_meta_tensor_no_storage",
    b"collections\nCounter",
]
ATOMS = [
    b"N",
    b"K\x01",
    b"K\x00",
    b"J\xff\xff\xff\xff",
    b"X\x01\x00\x00\x00a",
    b"X\x03\x00\x00\x00cpu",
    b"X\x07\x00\x00\x00storage",
    b"(",
    b"t",
    b")",
    b"]",
    b"}",
    b"a",
    b"e",
    b"s",
    b"u",
    b"R",
    b"\x81",
    b"b",
    b"\x85",
    b"\x86",
    b"\x87",
    b"q\x00",
    b"h\x00",
    b"q\x01",
    b"h\x01",
    b"\x88",
    b"\x89",
    b"Q",
    b"G\x3f\xf0\x00\x00\x00\x00\x00\x00",
    b"\x8f",
    b"\x90",
    b"\x91",
    b"2",
    b"0",
    b"1",
    b"C\x02ab",
    b"\x94",
    b"\x93",
    b"\x8c\x05numpy\x8c\x05dtype",
    b"X\x02\x00\x00\x00f4",
    b"X\x06\x00\x00\x00latin1",
    b"\x8a\x01\xff",
    b"X\x02\x00\x00\x00-1",
]


def _storage(pid):
    return Storage("0", 16, DTYPES["float32"], data=bytes(16))


@pytest.mark.parametrize("seed", range(4))
def test_opcode_soup(seed):
    rng = random.Random(seed)
    ops = list(OPCODE_NAMES)
    for _ in range(1500):
        parts = [b"\x80\x02"]
        for _k in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.25:
                parts.append(b"c" + rng.choice(GLOBALS) + b"\n")
            elif r < 0.95:
                parts.append(rng.choice(ATOMS))
            else:
                parts.append(bytes([rng.choice(ops)]))
        data = b"".join(parts) + b"."
        for wo in (True, False):
            try:
                v = Unpickler(
                    data, resolver=AllowlistResolver(DEFAULT_ALLOWLIST, weights_only=wo), persistent_load=_storage
                ).load()
                for _n, t in iter_tensors(v):
                    try:
                        t.numpy()
                    except TorchlessError:
                        pass
                describe(v)
            except TorchlessError:
                pass

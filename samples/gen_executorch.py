"""Write the ExecuTorch fixtures under samples/executorch/ and their expected values.

Run with a Python that has ``executorch`` (and its torch) installed, NOT torchless's own
environment: ``python3 -m venv /tmp/etvenv && /tmp/etvenv/bin/pip install executorch==1.5.1``
(plus a torch it accepts), then ``/tmp/etvenv/bin/python samples/gen_executorch.py``.

For each model it writes ``<name>.pte`` (``to_edge(export(...)).to_executorch()``) and
``<name>.json``: what executorch's own deserializer (``deserialize_pte_binary``) reads
back from those bytes: program version, per execution plan the operators, the kernel
calls (operator index, argument value indices), inputs/outputs, value kinds, delegates
(id, where the blob is, its size and sha256), and every constant tensor (value index,
dtype code, sizes, dim order, data_buffer_idx, sha256 of its bytes and the bytes as
hex for small ones). torchless's tests compare their reading of the .pte with this JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir._serialize._program import deserialize_pte_binary
from torch.export import Dim, export

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "executorch")


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(4, 3)
        self.l2 = torch.nn.Linear(3, 2)
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))
        self.register_buffer("halves", torch.linspace(-1, 1, 6).to(torch.float16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.l2(self.l1(x).relu()) * 0.5, self.steps + 1, self.halves * 2


class Dyn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w).sum(-1)


def describe(pte: bytes) -> dict:
    f = deserialize_pte_binary(pte)
    p = f.program
    out = {"version": p.version, "plans": [], "constant_buffers": []}
    for i, b in enumerate(p.constant_buffer):
        data = bytes(b.storage)
        out["constant_buffers"].append({"index": i, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    for plan in p.execution_plan:
        d = {
            "name": plan.name,
            "inputs": list(plan.inputs),
            "outputs": list(plan.outputs),
            "operators": [[o.name, o.overload] for o in plan.operators],
            "non_const_buffer_sizes": list(plan.non_const_buffer_sizes),
            "instructions": [],
            "values": [],
            "constants": [],
            "delegates": [],
        }
        for ch in plan.chains:
            for ins in ch.instructions:
                a = ins.instr_args
                d["instructions"].append([type(a).__name__] + [getattr(a, fld.name) for fld in dataclasses.fields(a)])
        for vi, ev in enumerate(plan.values):
            v = ev.val
            d["values"].append(type(v).__name__)
            if type(v).__name__ == "Tensor" and v.data_buffer_idx > 0 and v.allocation_info is None:
                data = bytes(p.constant_buffer[v.data_buffer_idx].storage)
                numel = 1
                for s in v.sizes:
                    numel *= s
                d["constants"].append(
                    {
                        "value": vi,
                        "scalar_type": int(v.scalar_type),
                        "sizes": list(v.sizes),
                        "dim_order": list(v.dim_order),
                        "data_buffer_idx": v.data_buffer_idx,
                        "sha256_buffer": hashlib.sha256(data).hexdigest(),
                        "hex": data.hex() if len(data) <= 256 else None,
                        "name": getattr(v.extra_tensor_info, "fully_qualified_name", None) if v.extra_tensor_info else None,
                    }
                )
        for dg in plan.delegates:
            # the deserializer moves segment blobs inline, so the blob is compared, not where it was
            blob = bytes(p.backend_delegate_data[dg.processed.index].data) if int(dg.processed.location) == 0 else b""
            d["delegates"].append(
                {
                    "id": dg.id,
                    "size": len(blob),
                    "sha256": hashlib.sha256(blob).hexdigest(),
                    "compile_specs": {c.key: bytes(c.value).hex() for c in dg.compile_specs},
                }
            )
        out["plans"].append(d)
    return out


def main() -> None:
    os.makedirs(HERE, exist_ok=True)
    progs = {}
    progs["mlp"] = to_edge(export(MLP(), (torch.randn(2, 4),))).to_executorch()
    ep = export(Dyn(), (torch.randn(2, 3),), dynamic_shapes={"x": {0: Dim("b", min=1, max=8)}})
    progs["dynamic"] = to_edge(ep).to_executorch()
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        ep = export(MLP(), (torch.randn(2, 4),))
        progs["xnnpack"] = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as e:  # the delegate backend is optional
        print("xnnpack: not written:", e, file=sys.stderr)
    for name, prog in progs.items():
        data = bytes(prog.buffer)
        with open(os.path.join(HERE, f"{name}.pte"), "wb") as f:
            f.write(data)
        exp = describe(data)
        exp["file_size"] = len(data)
        exp["identifier"] = data[4:8].decode("latin-1")
        with open(os.path.join(HERE, f"{name}.json"), "w") as f:
            json.dump(exp, f, indent=1, sort_keys=True)
        print(name, len(data), "bytes")


if __name__ == "__main__":
    main()

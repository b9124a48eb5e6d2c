"""Write ``.pt2`` fixtures with an older torch, and what that torch reads back from them.

torchless reads ExportedPrograms that torch 2.5, 2.6 and 2.7 wrote (export schemas before
8.x). Run this once per version in a throwaway environment, never in torchless's own::

    python3 -m venv /tmp/t25 && /tmp/t25/bin/pip install torch==2.5.1 numpy
    /tmp/t25/bin/python samples/make_old_pt2.py        # -> samples/old_pt2/2.5/

It exports three small models (an MLP with a buffer; a model with a dynamic batch
dimension; one with ``torch.cond``, where that version exports it), saves each with
``torch.export.save`` and records in ``expected.json``, from ``torch.export.load`` of the
saved file: the schema version, per graph node its op, target and name, the printed
``graph_module.code``, the signature's input/output kinds and targets, every state-dict
tensor and constant (dtype, shape, sha256 of its bytes, values for small ones) and the
output for the example input. torchless's tests compare their reading with this file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import warnings
import zipfile

import torch

VERSION = ".".join(torch.__version__.split("+")[0].split(".")[:2])
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "old_pt2", VERSION)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x))) * self.scale


class Dyn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w).softmax(-1) + x.shape[0]


def _yes(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (y @ w).sin()


def _no(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (y.cos() @ w) * 2


class Cond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, _yes, _no, (x, self.w))


def tensor_record(t: torch.Tensor) -> dict:
    t = t.detach().contiguous()
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "values": t.flatten().tolist() if t.numel() <= 64 else None,
    }


def describe(path: str, example: tuple) -> dict:
    ep = torch.export.load(path)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        ver = [n for n in names if n.split("/")[-1] in ("version", "schema_version", "archive_version")]
        versions = {n: z.read(n).decode("utf-8", "replace").strip() for n in ver}
    graphs = {}
    for name, gm in [("", ep.graph_module)] + [
        (n, m) for n, m in ep.graph_module.named_modules() if n and isinstance(m, torch.fx.GraphModule)
    ]:
        graphs[name] = {
            "nodes": [[n.op, str(n.target) if n.op != "placeholder" else "", n.name] for n in gm.graph.nodes],
            "code": re.sub(r"\s+#.*", "", gm.code).strip(),
        }
    sig = ep.graph_signature
    out = ep.module()(*example)
    return {
        "torch": torch.__version__,
        "records": sorted(names),
        "version_records": versions,
        "graphs": graphs,
        "inputs": [[s.kind.name, s.arg.name, getattr(s, "target", None)] for s in sig.input_specs],
        "outputs": [[s.kind.name, s.arg.name, getattr(s, "target", None)] for s in sig.output_specs],
        "state_dict": {k: tensor_record(v) for k, v in ep.state_dict.items()},
        "constants": {k: tensor_record(v) for k, v in ep.constants.items() if isinstance(v, torch.Tensor)},
        "range_constraints": {str(k): str(v) for k, v in ep.range_constraints.items()},
        "example_input": [tensor_record(a) for a in example],
        "example_output": tensor_record(out if isinstance(out, torch.Tensor) else out[0]),
    }


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    cases = {
        "mlp": (MLP(), (torch.randn(2, 4),), None),
        "dynamic": (Dyn(), (torch.randn(3, 5),), {"x": {0: torch.export.Dim("batch", min=2, max=64)}}),
        "cond": (Cond(), (torch.randn(4, 3),), None),
    }
    expected = {}
    for name, (model, example, dyn) in cases.items():
        path = os.path.join(OUT, f"{name}.pt2")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ep = torch.export.export(model.eval(), example, dynamic_shapes=dyn)
                for m in ep.graph_module.modules():
                    if isinstance(m, torch.fx.GraphModule):
                        for node in m.graph.nodes:
                            node.meta.pop("stack_trace", None)  # paths of the exporting machine
                torch.export.save(ep, path)
                expected[name] = describe(path, example)
        except Exception as e:  # noqa: BLE001 (a version without cond export, say)
            print(f"{name}: not exported with torch {torch.__version__}: {type(e).__name__}: {e}", file=sys.stderr)
            expected[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            if os.path.exists(path):
                os.remove(path)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    print("wrote", OUT, sorted(expected))


if __name__ == "__main__":
    main()

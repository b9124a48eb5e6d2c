"""torchless's graph IR, shared by every graph-carrying format (.pt2, TorchScript, ONNX...).

* :mod:`.ir`: ``Graph``/``Node`` with FX's six opcodes, ``Namespace``, ``lint()``, and their
  printing: ``GraphModule.code``-style Python, a node table, FX's ``str(graph)``.
* :mod:`.schema`: ATen schema parser and the core/non-core schema registry.
* :mod:`.verifier`: the ATen-IR verifier.
"""

from .ir import OPCODES, Graph, Namespace, Node, OpRef, SymValue, TensorValue, map_arg

__all__ = ["OPCODES", "Graph", "Namespace", "Node", "OpRef", "SymValue", "TensorValue", "map_arg"]

"""The ATen reference interpreter: runs an ExportedProgram's graph on NumPy, without torch.

Layer: above ``graph`` (it walks :class:`~torchless.graph.ir.Graph`), below ``formats``
(``formats/pt2`` offers ``Program.run`` / ``.module()`` on top of it).

* :mod:`.registry` — one kernel per operator key, and the calling convention every kernel
  follows.
* ``kernels/`` — the kernels, one module per family; each registers itself on import.
"""

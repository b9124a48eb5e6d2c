"""The ATen reference interpreter: runs an ExportedProgram's graph on NumPy, without torch.

Layer: above ``graph`` (it walks :class:`~torchless.graph.ir.Graph`), below ``formats``
(``formats/pt2`` offers ``Program.run`` / ``.module()`` on top of it).

* :mod:`.registry` — one kernel per operator key, and the calling convention every kernel
  follows.
* ``kernels/`` — the kernels, one module per family; each registers itself on import.
* :mod:`.interpreter` — the node loop (``run_graph``): kernels resolved and checked before
  anything runs, values freed after their last use, subgraphs as callables.
* :mod:`.program` — a program's parameters, buffers and constants bound, its outputs split
  into user outputs and mutations (``ProgramRunner``).
* :mod:`.guards` — input checks: ranks, sizes, symbols against ``range_constraints``, dtypes,
  and the program's ``guards_code`` (evaluated, never executed).
* :mod:`.autocast` — CPU autocast's casting policy for enabled autocast regions.
* :mod:`.limits` — the memory and ``while_loop`` caps (``RunLimits``), checked before a
  kernel allocates and on every result.

See ``docs/interpreter.md``.
"""

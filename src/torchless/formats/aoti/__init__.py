"""AOTInductor packages: list, inspect, verify and unpack without loading the ``.so``.

See :mod:`torchless.formats.aoti.read` (parsing), :mod:`~torchless.formats.aoti.extract`
(safe unpacking) and :mod:`~torchless.formats.aoti.handler` (the ``aoti`` format).
"""

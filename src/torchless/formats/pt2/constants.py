"""Old name of :mod:`.spec` (the pt2 layout facts live there)."""

from .spec import *  # noqa: F403
from .spec import __all__  # noqa: F401

"""Old name of :mod:`.spec` (the aoti layout facts live there)."""

from .spec import *  # noqa: F403
from .spec import __all__  # noqa: F401

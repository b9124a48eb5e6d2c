"""Old name of :mod:`.spec` (the Hugging Face layout facts live there)."""

from .spec import *  # noqa: F403
from .spec import (
    __all__,  # noqa: F401
    index_shards,  # noqa: F401
)

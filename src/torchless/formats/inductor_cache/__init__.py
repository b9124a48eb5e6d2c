"""TorchInductor cache folders: inventory (:mod:`.inventory`) and pruning (:mod:`.prune`).

This is a folder of implementation details (pickles and generated code keyed by hashes of
the torch build), not an artifact format, so it has no format handler: use
``torchless cache`` or :func:`~torchless.formats.inductor_cache.inventory.inventory`.
"""

from .inventory import CacheEntry, CacheInventory, default_cache_dir, entry_source, inventory, resolve_cache_dir
from .prune import PrunePlan, PruneResult, apply_prune, parse_duration, plan_prune

__all__ = [
    "CacheEntry",
    "CacheInventory",
    "PrunePlan",
    "PruneResult",
    "apply_prune",
    "default_cache_dir",
    "entry_source",
    "inventory",
    "parse_duration",
    "plan_prune",
    "resolve_cache_dir",
]

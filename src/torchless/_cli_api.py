"""What the command line calls below the public API: the one facade of ``torchless.cli``.

A command is parse -> one library call -> render. The call is the public API
(:mod:`torchless`, :mod:`torchless.dcp`, :mod:`torchless.diff`, :mod:`torchless.scan`,
:mod:`torchless.view`) or one of the names below, each the library's own function or type
under the name the commands use; no command imports ``formats/``, ``interp/``, ``graph/``,
``jobs/`` or ``io/`` itself (``tests/cli/test_cli_facade.py`` checks it). Values of
``core/`` (errors, dtypes, tensors, sizes) are imported from ``core`` directly.

Every name is imported on first use (the command line starts without importing the
formats it does not run).

Opening by kind:
    probe_and_detect, Artifact, LoadPolicy, handlers, CAPABILITIES
Convert and verify:
    Transform, check_digests
DCP and range jobs:
    reshard, reshard_plan, cleanup_staging
Format commands:
    Pt2Artifact, set_pt2_weights, OnnxArtifact, set_onnx_weights,
    set_torchscript_weights, extract_archive, Node
Running a program:
    RUN_LIMITS, RunLimits, run_limits
Inductor cache:
    CACHE_KINDS, inventory, entry_source, locate_cache_dir, plan_prune,
    apply_prune, parse_duration
Scan reports:
    format_scan_json, format_scan_sarif, format_scan_text
Process-wide state of a command:
    REMOTE_STATS, set_default_storage_options, interrupted, interrupted_cleanup
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.lazy import lazy_exports

#: name -> where it lives (``module:attribute``)
EXPORTS: dict[str, str] = {
    "probe_and_detect": "torchless.formats.registry:probe_and_detect",
    "Artifact": "torchless.formats.base:Artifact",
    "LoadPolicy": "torchless.formats.base:LoadPolicy",
    "handlers": "torchless.formats.registry:handlers",
    "CAPABILITIES": "torchless.formats.base:CAPABILITIES",
    "Transform": "torchless.formats.transform:Transform",
    "check_digests": "torchless.io.digests:check_digests",
    "reshard": "torchless.formats.dcp.reshard:reshard",
    "reshard_plan": "torchless.formats.dcp.plan:plan",
    "cleanup_staging": "torchless.formats.hf.ranged:cleanup",
    "Pt2Artifact": "torchless.formats.pt2.handler:Pt2Artifact",
    "set_pt2_weights": "torchless.formats.pt2.write:set_weights",
    "OnnxArtifact": "torchless.formats.onnx.handler:OnnxArtifact",
    "set_onnx_weights": "torchless.formats.onnx.write:set_weights",
    "onnx_data_file_for": "torchless.formats.onnx.write:data_file_for",
    "onnx_writes_data_file": "torchless.formats.onnx.write:writes_data_file",
    "set_torchscript_weights": "torchless.formats.torchscript.write:set_weights",
    "extract_archive": "torchless.formats.aoti.extract:extract_archive",
    "Node": "torchless.graph.ir:Node",
    "RUN_LIMITS": "torchless.interp.limits:RUN_LIMITS",
    "RunLimits": "torchless.interp.limits:RunLimits",
    "run_limits": "torchless.interp.limits:run_limits",
    "CACHE_KINDS": "torchless.formats.inductor_cache.inventory:KINDS",
    "inventory": "torchless.formats.inductor_cache.inventory:inventory",
    "entry_source": "torchless.formats.inductor_cache.inventory:entry_source",
    "locate_cache_dir": "torchless.formats.inductor_cache.inventory:locate_cache_dir",
    "plan_prune": "torchless.formats.inductor_cache.prune:plan_prune",
    "apply_prune": "torchless.formats.inductor_cache.prune:apply_prune",
    "parse_duration": "torchless.formats.inductor_cache.prune:parse_duration",
    "format_scan_json": "torchless.scan.report:format_json",
    "format_scan_sarif": "torchless.scan.report:format_sarif",
    "format_scan_text": "torchless.scan.report:format_text",
    "REMOTE_STATS": "torchless.io.remote:STATS",
    "resolve_location": "torchless.io.store:resolve",
    "store_for": "torchless.io.store:store_for",
    "set_default_storage_options": "torchless.io.remote:set_default_options",
    "interrupted": "torchless.io.atomic:interrupted",
    "interrupted_cleanup": "torchless.io.atomic:interrupted_cleanup",
}

__all__ = sorted(EXPORTS)

if TYPE_CHECKING:  # the same names for the type checker (a test checks both lists agree)
    from .formats.aoti.extract import extract_archive as extract_archive
    from .formats.base import CAPABILITIES as CAPABILITIES
    from .formats.base import Artifact as Artifact
    from .formats.base import LoadPolicy as LoadPolicy
    from .formats.dcp.plan import plan as reshard_plan  # noqa: F401
    from .formats.dcp.reshard import reshard as reshard
    from .formats.hf.ranged import cleanup as cleanup_staging  # noqa: F401
    from .formats.inductor_cache.inventory import KINDS as CACHE_KINDS  # noqa: F401
    from .formats.inductor_cache.inventory import entry_source as entry_source
    from .formats.inductor_cache.inventory import inventory as inventory
    from .formats.inductor_cache.inventory import locate_cache_dir as locate_cache_dir
    from .formats.inductor_cache.prune import apply_prune as apply_prune
    from .formats.inductor_cache.prune import parse_duration as parse_duration
    from .formats.inductor_cache.prune import plan_prune as plan_prune
    from .formats.onnx.handler import OnnxArtifact as OnnxArtifact
    from .formats.onnx.write import data_file_for as onnx_data_file_for  # noqa: F401
    from .formats.onnx.write import set_weights as set_onnx_weights  # noqa: F401
    from .formats.onnx.write import writes_data_file as onnx_writes_data_file  # noqa: F401
    from .formats.pt2.handler import Pt2Artifact as Pt2Artifact
    from .formats.pt2.write import set_weights as set_pt2_weights  # noqa: F401
    from .formats.registry import handlers as handlers
    from .formats.registry import probe_and_detect as probe_and_detect
    from .formats.torchscript.write import set_weights as set_torchscript_weights  # noqa: F401
    from .formats.transform import Transform as Transform
    from .graph.ir import Node as Node
    from .interp.limits import RUN_LIMITS as RUN_LIMITS
    from .interp.limits import RunLimits as RunLimits
    from .interp.limits import run_limits as run_limits
    from .io.atomic import interrupted as interrupted
    from .io.atomic import interrupted_cleanup as interrupted_cleanup
    from .io.digests import check_digests as check_digests
    from .io.remote import STATS as REMOTE_STATS  # noqa: F401
    from .io.remote import set_default_options as set_default_storage_options  # noqa: F401
    from .io.store import resolve as resolve_location  # noqa: F401
    from .io.store import store_for as store_for
    from .scan.report import format_json as format_scan_json  # noqa: F401
    from .scan.report import format_sarif as format_scan_sarif  # noqa: F401
    from .scan.report import format_text as format_scan_text  # noqa: F401

_lazy = lazy_exports(__name__, EXPORTS)


def __getattr__(name: str) -> Any:
    return _lazy(name)

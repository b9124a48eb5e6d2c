"""What a scan reports: findings per file, and the run as a whole."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.findings import SEVERITIES, UNANALYSED_RULES, Finding

__all__ = [
    "SEVERITIES",
    "VERDICTS",
    "UNANALYSED_RULES",
    "EXIT_CODES",
    "LOADERS",
    "RULES",
    "AllowNote",
    "FileReport",
    "ScanReport",
]

#: file verdicts, from the best to the worst news; ``error`` is a file that could not be read.
VERDICTS = ("clean", "suspicious", "unanalysable", "dangerous", "error")

#: the exit code each verdict contributes; a scan exits with the highest of its files'
#: codes, except that ``error`` (2) wins only while nothing was found elsewhere.
EXIT_CODES = {"clean": 0, "suspicious": 1, "unanalysable": 1, "dangerous": 1, "error": 2}

#: the loaders a finding can name (``Finding.loader``): who would execute the bytes.
LOADERS = (
    "pickle.load",
    "torch.load(weights_only=False)",
    "torch.load(weights_only=True)",
    "torch.jit.load",
    "torch.jit._load_for_lite_interpreter",
    "torch.export.load",
    "torch._inductor.aoti_load_package",
    "torch.distributed.checkpoint.load",
    "numpy.load(allow_pickle=True)",
    "joblib.load",
    "torch.compile (inductor cache)",
    "torch.package.PackageImporter",
    "transformers from_pretrained(trust_remote_code=True)",
    "onnx.load",
    "executorch Program::load",
)

#: rule id -> one-line description (also the SARIF rule table).
RULES: dict[str, str] = {
    "dangerous-global": "the pickle names a global that runs code, touches files or the network, or reaches one",
    "indirect-call": "the pickle calls a value computed at load time (getattr/attrgetter/partial/... indirection)",
    "global-mutation": "BUILD sets attributes on a class or function the pickle names (monkey-patching at load time)",
    "unknown-global": "the pickle names a global that is not on torchless's allowlist",
    "malformed-pickle": "a pickle stream that cannot be run to its STOP (analysis covers what ran before the error)",
    "frame-length": "a FRAME's declared length does not match the opcodes (readers that trust frames see other bytes)",
    "trailing-data": "bytes after a pickle's STOP or after an archive's end record",
    "zip-duplicate": "several zip members share a name; torch and Python's zipfile may read different copies",
    "zip-case-variant": "a member matches a record name only case-insensitively (torch reads it, others do not)",
    "zip-name-mismatch": "local header and central directory name a member differently",
    "zip-crc": "a member's CRC-32 does not match (Python's zipfile refuses it; torch does not check)",
    "zip-flags": "encrypted or unusual zip general-purpose flag bits or compression method",
    "zip-overlap": "zip members overlap each other or the central directory",
    "zip-reader-differential": "members that one zip reader sees and another does not",
    "path-traversal": "a member name escapes the extraction folder",
    "polyglot": "the file is read as two different formats by different loaders",
    "torchscript-code": "TorchScript code in the archive runs at load time or calls risky operators",
    "dcp-layout": "distributed-checkpoint items that the metadata does not account for",
    "limit": "a part of the file is too large or too deep to analyse",
    "unreadable": "the file could not be read",
    "unanalysable": "bytes that a loader could execute and that the scanner could not analyse completely",
    "unrecognized": "the file is not a format the scanner models; what a loader would do with it is unknown",
    "engine-disagreement": "CPython's unpickler and torchless's pickle machine disagree on what a stream does",
    "nested-loader": "a global that deserialises its argument (a pickle, archive or code inside the pickle)",
    "native-code": "content a loader compiles, runs through a shell, or loads as a native library",
    "link-escape": "a path or symlink that leaves the artifact",
    "source-code": "Python source a loader runs (torch.package modules, Hugging Face remote code) does what model code does not",
    "cache-code": "generated code in a compile cache that inductor's code generator would not have emitted",
}


@dataclass
class AllowNote:
    """A global ``torch.load(weights_only=True)`` refuses, and whether allowing it is safe."""

    global_name: str
    verdict: str  # safe | unknown | dangerous
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"global": self.global_name, "verdict": self.verdict, "reason": self.reason}


@dataclass
class FileReport:
    """The scan of one file (or one DCP/TorchScript directory entry)."""

    path: str
    kind: str = "unknown"  # carrier: torch-zip, legacy, tar, torchscript, pt2, dcp-metadata, distcp, npy, npz, pickle ...
    findings: list[Finding] = field(default_factory=list)
    streams: int = 0  # pickle streams analysed
    globals: dict[str, str] = field(default_factory=dict)  # qualname -> verdict
    weights_only: list[AllowNote] = field(default_factory=list)
    weights_only_blockers: list[str] = field(default_factory=list)  # non-global reasons torch refuses
    error: str | None = None
    seconds: float = 0.0
    #: with ``scan(..., coverage=True)``: what was analysed, one dict each: pickle streams
    #: ``{"what": "pickle", "member", "offset", "length", "finished", "sha256"}`` (the
    #: stream's bytes from its first opcode through STOP) and sources analysed as code
    #: ``{"what": "source", "member", "length", "sha256"}`` (of the text, UTF-8)
    coverage: list[dict[str, Any]] | None = None

    def counted(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != "info"]

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS`.

        ``dangerous``: a critical finding. ``unanalysable``: part of the file that a loader
        could execute was not analysed (:data:`UNANALYSED_RULES`). ``suspicious``: other
        findings. ``error``: the file could not be read and nothing was found. ``clean``:
        every byte any supported loader could execute was analysed and nothing was found.
        """
        counted = [f for f in self.counted() if f.rule != "unreadable"]
        if any(f.severity == "critical" for f in counted):
            return "dangerous"
        if self.error and not counted:
            return "error"
        if any(f.unanalysed for f in counted):
            return "unanalysable"
        if counted:
            return "suspicious"
        if self.error:
            return "error"
        return "clean"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "verdict": self.verdict,
            "streams": self.streams,
            "globals": dict(self.globals),
            "findings": [f.to_dict() for f in self.findings],
            "weights_only": {
                "refused_globals": [n.to_dict() for n in self.weights_only],
                "other_blockers": list(self.weights_only_blockers),
            },
            "error": self.error,
            "seconds": round(self.seconds, 6),
        } | ({} if self.coverage is None else {"coverage": list(self.coverage)})


@dataclass
class ScanReport:
    """All files of one scan."""

    files: list[FileReport]

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings]

    @property
    def clean(self) -> bool:
        return all(r.verdict == "clean" for r in self.files)

    @property
    def exit_code(self) -> int:
        """0 every file clean; 1 findings (suspicious, unanalysable, dangerous); 2 a file
        could not be read and nothing was found elsewhere; 2 also for an empty scan (no file)."""
        if not self.files:
            return 2
        codes = [EXIT_CODES[r.verdict] for r in self.files]
        if 1 in codes:
            return 1
        return max(codes)

    def to_dict(self) -> dict[str, Any]:
        verdicts: dict[str, int] = {}
        for r in self.files:
            verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
        return {
            "files": [r.to_dict() for r in self.files],
            "summary": {
                "files": len(self.files),
                "verdicts": verdicts,
                "findings": len([f for f in self.findings if f.severity != "info"]),
            },
            "exit_code": self.exit_code,
        }

    def __iter__(self) -> Iterator[FileReport]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

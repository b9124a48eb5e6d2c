"""Generate the review-3 corpus (issue 30, item 2): executable source as a carrier.

Usage: ``python gen_review3_source.py OUT_DIR [--no-torch]``

Samples whose payload is Python source that a loader runs: torch.package modules
(``PackageImporter.load_pickle/load_text/load_binary/import_module``) and Hugging Face
remote code (``from_pretrained(..., trust_remote_code=True)``, ``pipeline``). Each payload
only creates a marker file named after the sample in the current directory (the runner,
``run_review3_source.py``, runs each sample with the marker directory as its working
directory), either with ``open(name, 'w')`` or through ``os.system('touch
"$TORCHLESS_SCAN_MARKER_DIR/name"')``.

``OUT_DIR/manifest.json``: ``{"samples": [...], "controls": [...]}``; a sample has ``name``,
``loader`` (see the runner), ``load`` (what the loader opens, relative to OUT_DIR), ``arg``
(the loader's extra argument), ``scan`` (what to scan, relative to OUT_DIR), ``technique``
and ``torch`` (built with torch's PackageExporter). Controls are benign: a packaged
``nn.Module`` exported by PackageExporter and a transformers-style remote-code model; they
must not scan DANGEROUS.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
from typing import Any

ENV = "TORCHLESS_SCAN_MARKER_DIR"


@dataclasses.dataclass
class Sample:
    name: str
    loader: str
    technique: str
    load: str = ""
    arg: str = ""
    scan: str = ""
    torch: bool = False

    def entry(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["load"] = self.load or self.name
        d["scan"] = self.scan or self.load or self.name
        return d


def touch(name: str) -> str:
    """Python that creates the marker in the working directory (no import needed)."""
    return f"open({name!r}, 'w').close()\n"


def shell(name: str) -> str:
    return f"os.system('touch \"${ENV}/{name}\"')\n"


# -- torch.package --------------------------------------------------------------------


def _package(path: str, build: Any, extern: tuple[str, ...] = ()) -> None:
    from torch.package import PackageExporter

    with PackageExporter(path) as pe:
        if extern:
            pe.extern(list(extern))
        build(pe)


def packages(out: str) -> list[Sample]:
    s: list[Sample] = []

    n = "pkg_init_load_pickle"
    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (
            pe.save_source_string("res", touch(n), is_package=True),
            pe.save_pickle("res", "model.pkl", {"w": [1.0, 2.0]}),
        ),
    )
    s.append(
        Sample(
            n, "package-pickle", "res/__init__.py runs: load_pickle imports the resource's package", n + ".pt", "res/model.pkl"
        )
    )

    n = "pkg_init_load_text"
    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (pe.save_source_string("res", touch(n), is_package=True), pe.save_text("res", "note.txt", "hello")),
    )
    s.append(
        Sample(n, "package-text", "res/__init__.py runs: load_text imports the resource's package", n + ".pt", "res/note.txt")
    )

    n = "pkg_init_load_binary"
    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (pe.save_source_string("blob", touch(n), is_package=True), pe.save_binary("blob", "w.bin", b"\0" * 8)),
    )
    s.append(Sample(n, "package-binary", "blob/__init__.py runs: load_binary imports the package", n + ".pt", "blob/w.bin"))

    n = "pkg_import_module_unreferenced"
    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (
            pe.save_source_string("models.net", "import os\n" + shell(n) + "class Net:\n    pass\n"),
            pe.save_pickle("res", "model.pkl", {"w": [1.0]}),
        ),
        extern=("os",),
    )
    s.append(Sample(n, "package-module", "import_module of a module no pickle names", n + ".pt", "models.net"))

    n = "pkg_nested_init_chain"
    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (
            pe.save_source_string("a", touch(n), is_package=True),
            pe.save_source_string("a.b", "X = 1\n", is_package=True),
            pe.save_pickle("a.b.c", "data.pkl", [1, 2, 3]),
        ),
    )
    s.append(
        Sample(n, "package-pickle", "a/__init__.py runs as the parent chain of a.b.c (load_pickle)", n + ".pt", "a/b/c/data.pkl")
    )

    n = "pkg_obfuscated_getattr_import"
    src = f"getattr(__import__('o' + 's'), 'sys' + 'tem')('touch \"${ENV}/{n}\"')\n"
    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (
            pe.save_source_string("util", "import os\n", is_package=True),  # os is extern'd only when some module uses it
            pe.save_source_string("util.helpers", src, dependencies=False),
        ),
        extern=("os",),
    )
    s.append(Sample(n, "package-module", "getattr(__import__('o'+'s'), 'sys'+'tem')(...)", n + ".pt", "util.helpers"))

    n = "pkg_global_names_module"
    sys.path.insert(0, os.path.join(out, "_src"))
    os.makedirs(os.path.join(out, "_src", "evilmod"), exist_ok=True)
    with open(os.path.join(out, "_src", "evilmod", "__init__.py"), "w"):
        pass
    with open(os.path.join(out, "_src", "evilmod", "thing.py"), "w") as f:
        f.write("import os\nif os.environ.get('" + ENV + "'):\n    " + shell(n) + "\nclass Thing:\n    pass\n")
    import evilmod.thing  # type: ignore[import-not-found]  (its payload needs the env variable: not set here)

    _package(
        os.path.join(out, n + ".pt"),
        lambda pe: (pe.intern("evilmod.**"), pe.save_pickle("m", "obj.pkl", evilmod.thing.Thing())),
        extern=("os",),
    )
    s.append(Sample(n, "package-pickle", "a pickle global names a packaged module that runs os.system", n + ".pt", "m/obj.pkl"))
    for x in s:
        x.torch = True
    return s


def package_control(out: str) -> dict[str, Any]:
    """A real export of a small nn.Module (its source interned, torch extern)."""
    os.makedirs(os.path.join(out, "_src", "tinynet"), exist_ok=True)
    with open(os.path.join(out, "_src", "tinynet", "__init__.py"), "w"):
        pass
    with open(os.path.join(out, "_src", "tinynet", "net.py"), "w") as f:
        f.write(
            textwrap.dedent(
                """\
                import math
                from typing import Optional

                import torch
                from torch import nn


                class TinyNet(nn.Module):
                    def __init__(self, d: int = 4, scale: Optional[float] = None) -> None:
                        super().__init__()
                        self.proj = nn.Linear(d, d)
                        self.scale = scale or 1.0 / math.sqrt(d)

                    def forward(self, x: torch.Tensor) -> torch.Tensor:
                        return torch.relu(self.proj(x)) * self.scale
                """
            )
        )
    if os.path.join(out, "_src") not in sys.path:
        sys.path.insert(0, os.path.join(out, "_src"))
    import torch
    from tinynet.net import TinyNet  # type: ignore[import-not-found]

    torch.manual_seed(0)
    _package(
        os.path.join(out, "control_pkg.pt"),
        lambda pe: (pe.intern("tinynet.**"), pe.save_pickle("model", "model.pkl", TinyNet())),
        extern=("torch.**",),
    )
    return {
        "name": "control_pkg",
        "loader": "package-pickle",
        "load": "control_pkg.pt",
        "arg": "model/model.pkl",
        "scan": "control_pkg.pt",
    }


# -- Hugging Face remote code -------------------------------------------------------------

CONFIG_SRC = """\
from transformers import PretrainedConfig


class {cls}(PretrainedConfig):
    model_type = "{mt}"

    def __init__(self, hidden_size: int = 8, **kwargs):
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
"""

MODELING_SRC = """\
import math
from typing import Optional

import torch
from torch import nn
from transformers import PreTrainedModel

from .configuration_{mt} import {cfg}


class {cls}(PreTrainedModel):
    config_class = {cfg}

    def __init__(self, config: {cfg}):
        super().__init__(config)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = self.proj(x) / math.sqrt(x.shape[-1])
        return y if mask is None else y * mask
"""


def _folder(out: str, name: str, files: dict[str, Any]) -> str:
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for rel, content in files.items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(json.dumps(content, indent=2) if isinstance(content, dict) else content)
    return d


def hf(out: str) -> list[Sample]:
    s: list[Sample] = []

    n = "hf_config_auto_map"
    _folder(
        out,
        n,
        {
            "config.json": {"model_type": "evilcfg", "auto_map": {"AutoConfig": "configuration_evilcfg.EvilConfig"}},
            "configuration_evilcfg.py": "import os\n" + shell(n) + CONFIG_SRC.format(cls="EvilConfig", mt="evilcfg"),
        },
    )
    s.append(Sample(n, "hf-config", "config.json auto_map AutoConfig -> module-level os.system"))

    n = "hf_model_auto_map"
    _folder(
        out,
        n,
        {
            "config.json": {
                "model_type": "tiny",
                "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"},
            },
            "configuration_tiny.py": CONFIG_SRC.format(cls="TinyConfig", mt="tiny"),
            "modeling_tiny.py": touch(n) + MODELING_SRC.format(mt="tiny", cfg="TinyConfig", cls="TinyModel"),
        },
    )
    s.append(Sample(n, "hf-model", "config.json auto_map AutoModel -> modeling file writes a file at import"))

    n = "hf_relative_import_chain"
    _folder(
        out,
        n,
        {
            "config.json": {"model_type": "chain", "auto_map": {"AutoConfig": "configuration_chain.ChainConfig"}},
            "configuration_chain.py": "from .helpers import SCALE\n" + CONFIG_SRC.format(cls="ChainConfig", mt="chain"),
            "helpers.py": "from .deeper import X\nSCALE = 2\n",
            "deeper.py": "import subprocess\nsubprocess.run(['touch', '" + n + "'])\nX = 1\n",
        },
    )
    s.append(Sample(n, "hf-config", "the auto_map module imports .helpers, which imports .deeper (subprocess)"))

    n = "hf_obfuscated_import"
    _folder(
        out,
        n,
        {
            "config.json": {"model_type": "obf", "auto_map": {"AutoConfig": "configuration_obf.ObfConfig"}},
            "configuration_obf.py": f"getattr(__import__('o' + 's'), 'sys' + 'tem')('touch \"${ENV}/{n}\"')\n"
            + CONFIG_SRC.format(cls="ObfConfig", mt="obf"),
        },
    )
    s.append(Sample(n, "hf-config", "getattr(__import__('o'+'s'), 'sys'+'tem')(...) in the AutoConfig module"))

    n = "hf_tokenizer_config_auto_map"
    _folder(
        out,
        n,
        {
            "tokenizer_config.json": {
                "tokenizer_class": "EvilTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]},
            },
            "config.json": {"model_type": "bert"},
            "tokenization_evil.py": "import os\n"
            + shell(n)
            + "from transformers import PreTrainedTokenizer\n\n\nclass EvilTokenizer(PreTrainedTokenizer):\n    pass\n",
        },
    )
    s.append(Sample(n, "hf-tokenizer", "tokenizer_config.json auto_map AutoTokenizer [slow, null]"))

    n = "hf_repo_dashdash"
    rev = "0" * 40
    hub = os.path.join(out, n)
    victim = os.path.join("models--victim--model", "snapshots", rev)
    attacker = os.path.join("models--attacker--code", "snapshots", rev)
    _folder(
        out,
        n,
        {
            os.path.join(victim, "config.json"): {
                "model_type": "dd",
                "auto_map": {"AutoConfig": "attacker/code--configuration_dd.DdConfig"},
            },
            os.path.join("models--victim--model", "refs", "main"): rev,
            os.path.join(attacker, "configuration_dd.py"): "import os\n" + shell(n) + CONFIG_SRC.format(cls="DdConfig", mt="dd"),
            os.path.join("models--attacker--code", "refs", "main"): rev,
        },
    )
    s.append(
        Sample(
            n, "hf-hub-config", "auto_map 'attacker/code--configuration_dd.DdConfig' (another repo, Hub cache)", n, "victim/model"
        )
    )
    del hub

    n = "hf_custom_pipelines"
    _folder(
        out,
        n,
        {
            "config.json": {
                "model_type": "bert",
                "vocab_size": 10,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 8,
                "custom_pipelines": {
                    "evil-task": {"impl": "pipe_evil.EvilPipeline", "pt": ["AutoModel"], "tf": [], "type": "text"}
                },
            },
            "pipe_evil.py": touch(n) + "from transformers import Pipeline\n\n\nclass EvilPipeline(Pipeline):\n    pass\n",
        },
    )
    s.append(Sample(n, "hf-pipeline", "config.json custom_pipelines impl", n, "evil-task"))

    n = "hf_preprocessor_auto_map"
    _folder(
        out,
        n,
        {
            "preprocessor_config.json": {"auto_map": {"AutoFeatureExtractor": "feature_extraction_evil.EvilExtractor"}},
            "config.json": {"model_type": "bert"},
            "feature_extraction_evil.py": "import socket\nsocket.gethostname()\n"
            + touch(n)
            + "from transformers.feature_extraction_utils import FeatureExtractionMixin\n\n\n"
            "class EvilExtractor(FeatureExtractionMixin):\n    pass\n",
        },
    )
    s.append(Sample(n, "hf-feature-extractor", "preprocessor_config.json auto_map AutoFeatureExtractor (imports socket)"))
    return s


def hf_control(out: str) -> dict[str, Any]:
    """A transformers-style remote-code model without a payload."""
    _folder(
        out,
        "control_hf",
        {
            "config.json": {
                "model_type": "tiny",
                "hidden_size": 8,
                "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"},
            },
            "configuration_tiny.py": CONFIG_SRC.format(cls="TinyConfig", mt="tiny"),
            "modeling_tiny.py": MODELING_SRC.format(mt="tiny", cfg="TinyConfig", cls="TinyModel"),
        },
    )
    return {"name": "control_hf", "loader": "hf-config", "load": "control_hf", "arg": "", "scan": "control_hf"}


def main(argv: list[str]) -> None:
    out = argv[0]
    use_torch = "--no-torch" not in argv
    os.makedirs(out, exist_ok=True)
    samples = (packages(out) if use_torch else []) + hf(out)
    controls = ([package_control(out)] if use_torch else []) + [hf_control(out)]
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"samples": [x.entry() for x in samples], "controls": controls}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])

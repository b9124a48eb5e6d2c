"""One load policy (torchless.LoadPolicy), decided once when an artifact is opened.

Every registered handler refuses an unknown option (naming it and the accepted ones),
a keyword option contradicting the policy given with it, and a ``load()`` asking for
the other ``weights_only``. Handlers take the policy object, never ``**kwargs``.
"""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

import pytest

import torchless
from torchless import LoadPolicy, UnsafeGlobalError, UsageError
from torchless.formats.base import LOAD_POLICY_FIELDS, FormatHandler, accepted_options
from torchless.formats.registry import handler, handlers
from torchless.pickle.machine import Limits
from torchless.testing import ConformanceSkip
from torchless.testing.handlers import Suite

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
HANDLERS = [h.name for h in handlers()]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    return Suite(tmp_path_factory.mktemp("policy"), SAMPLES)


def _sample(suite: Suite, name: str):
    try:
        return suite.samples(name)[0]
    except ConformanceSkip as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", HANDLERS)
def test_every_handler_refuses_an_unknown_option_naming_the_accepted_ones(suite, name):
    s = _sample(suite, name)
    for opener in (
        lambda: torchless.open(s.path, format=name, **s.open_options, no_such_option=1),
        lambda: handler(name).open(s.path, **s.open_options, no_such_option=1),
    ):
        with pytest.raises(UsageError) as ei:
            opener()
        msg = str(ei.value)
        assert "no_such_option" in msg
        for ok in accepted_options(handler(name), "open"):
            assert ok in msg, (name, ok, msg)


@pytest.mark.parametrize("name", HANDLERS)
def test_every_handler_refuses_a_conflicting_policy(suite, name):
    s = _sample(suite, name)
    strict = LoadPolicy(weights_only=True)
    with pytest.raises(UsageError, match="weights_only=False conflicts"):
        torchless.open(s.path, format=name, policy=strict, weights_only=False, **s.open_options)
    with pytest.raises(UsageError, match="conflicts"):
        handler(name).open(s.path, strict, mmap=False, **s.open_options)
    with pytest.raises(UsageError, match="LoadPolicy"):
        torchless.open(s.path, format=name, policy={"weights_only": False}, **s.open_options)
    # the same value twice is one policy, not a conflict
    lax = LoadPolicy(weights_only=False)
    with torchless.open(s.path, format=name, policy=lax, weights_only=False, **s.open_options) as art:
        assert art.policy is lax and art.weights_only is False
        art.load()
        art.load(weights_only=False)
        with pytest.raises(UsageError, match="opened with weights_only=False"):
            art.load(weights_only=True)


@pytest.mark.parametrize("name", HANDLERS)
def test_handlers_take_the_policy_object_and_no_kwargs(name):
    h = handler(name)
    assert type(h).open is FormatHandler.open, f"{name} overrides open: the policy is resolved in one place"
    sig = inspect.signature(type(h)._open)
    params = list(sig.parameters.values())
    assert [p.name for p in params[:4]] == ["self", "path", "policy", "probe"], name
    assert not any(p.kind is p.VAR_KEYWORD for p in params), f"{name}._open swallows **kwargs"
    own = [p.name for p in params[4:]]
    assert sorted(own) == sorted(h.capabilities.open_options), (name, own)
    assert not set(own) & set(LOAD_POLICY_FIELDS), name


def test_policy_fields_are_validated():
    with pytest.raises(UsageError, match="weights_only must be True or False"):
        LoadPolicy(weights_only=0)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="limits"):
        LoadPolicy(limits={"max_memo": 3})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="allowed_globals"):
        LoadPolicy(allowed_globals="collections.OrderedDict")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="module.name"):
        LoadPolicy(allowed_globals=["OrderedDict"])
    p = LoadPolicy(allowed_globals=["a.B", "a.B"])
    assert p.allowed_globals == frozenset({"a.B"})
    with pytest.raises(AttributeError):
        p.weights_only = False  # type: ignore[misc]


class Custom:  # a class torchless's allowlist does not name
    def __init__(self, v):
        self.v = v


def test_allowed_globals_and_limits_reach_the_pickle_reader(tmp_path):
    p = tmp_path / "c.pt"
    import io
    import zipfile

    # a zip checkpoint whose data.pkl names a class outside the allowlist (written by CPython's pickle)
    data = pickle.dumps({"c": Custom(3)}, protocol=2)
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("c/data.pkl", data)
        z.writestr("c/version", "3\n")
    with pytest.raises(UnsafeGlobalError, match="Custom"):
        torchless.load(p)
    name = f"{Custom.__module__}.Custom"
    obj = torchless.load(p, allowed_globals={name})  # weights_only stays True; the class is a placeholder
    assert type(obj["c"]).__name__ == "PickledObject"
    assert obj["c"].class_name.endswith("Custom")
    assert torchless.load(p, policy=LoadPolicy(allowed_globals=frozenset({name})))["c"].class_name == obj["c"].class_name
    with pytest.raises(torchless.LimitError):
        torchless.load(p, allowed_globals={name}, limits=Limits(max_input=8))
    del io


def test_load_policy_is_public_and_documented():
    assert "LoadPolicy" in torchless.__all__
    assert torchless.LoadPolicy is LoadPolicy
    doc = torchless.open.__doc__ or ""
    assert "policy" in doc

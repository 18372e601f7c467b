"""The async client mirrors the sync one: same classes, methods and parameters (the two are kept by hand)."""

from __future__ import annotations

import inspect

import pytest

import evalbox

PAIRS = [
    (evalbox.Client, evalbox.AsyncClient),
    (evalbox.Sandbox, evalbox.AsyncSandbox),
    (evalbox.Files, evalbox.AsyncFiles),
    (evalbox.Commands, evalbox.AsyncCommands),
    (evalbox.CommandHandle, evalbox.AsyncCommandHandle),
    (evalbox.Network, evalbox.AsyncNetwork),
    (evalbox.Evals, evalbox.AsyncEvals),
    (evalbox.Templates, evalbox.AsyncTemplates),
    (evalbox.Secrets, evalbox.AsyncSecrets),
]


# Deliberate differences of name (httpx's: an async close is aclose).
RENAMED = {"aclose": "close"}


def public(cls: type) -> dict[str, object]:
    """The public methods (classmethods and staticmethods too, as bound)."""
    return {
        RENAMED.get(n, n): getattr(cls, n) for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))
    }


def params(f: object) -> list[tuple[str, object, object]]:
    """Each parameter's name, kind and default (annotations differ: callbacks may be coroutines)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(("sync", "asyn"), PAIRS, ids=lambda c: c.__name__)
def test_async_mirrors_sync(sync: type, asyn: type) -> None:
    s, a = public(sync), public(asyn)
    assert sorted(s) == sorted(a), f"{asyn.__name__} differs from {sync.__name__} in its methods"
    for name in s:
        sp, ap = params(s[name]), params(a[name])
        assert sp == ap, f"{asyn.__name__}.{name}{ap} != {sync.__name__}.{name}{sp}"


def test_functions_mirror() -> None:
    assert params(evalbox.execute) == params(evalbox.async_execute)

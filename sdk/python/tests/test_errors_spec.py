"""The SDK's exceptions follow the error codes of api/openapi.yaml."""

from __future__ import annotations

import re
from pathlib import Path

import evalbox
from evalbox import errors

# Codes the SDK leaves to the base class (its status picks one otherwise).
_WITHOUT_CLASS = {"not_implemented"}


def _spec_codes() -> set[str]:
    spec = (Path(__file__).parents[3] / "api" / "openapi.yaml").read_text()
    m = re.search(r"\n    ErrorDetail:\n.*?\n          enum:\n((?:            - \w+\n)+)", spec, re.S)
    assert m, "no ErrorDetail code enum in api/openapi.yaml"
    return set(re.findall(r"- (\w+)", m.group(1)))


def test_every_spec_code_has_its_exception() -> None:
    codes = _spec_codes()
    mapped = set(errors._BY_CODE)
    assert codes - _WITHOUT_CLASS == mapped, (codes - mapped - _WITHOUT_CLASS, mapped - codes)


def test_rate_limited_carries_retry_after() -> None:
    err = errors.error_from_detail(
        {"code": "rate_limited", "message": "team a is over its 60 requests per minute"}, status=429, retry_after=3.0
    )
    assert isinstance(err, evalbox.RateLimitedError)
    assert err.retry_after == 3.0
    assert err.status == 429
    assert err.code == "rate_limited"

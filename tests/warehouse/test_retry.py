"""The catalog's one retry policy (warehouse/catalog/retry.py): a transient error is retried
with a doubling wait up to a bound, then raised; any other error at once."""

import time

import pytest

from attnbase.warehouse.catalog.retry import retry_transient


class Transient(Exception):
    pass


def test_a_transient_error_is_retried_until_it_passes():
    calls = []

    def attempt():
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise Transient("locked")
        return "ok"

    assert retry_transient(attempt, transient=lambda e: isinstance(e, Transient), within_s=5,
                           first_s=0.01, cap_s=0.02) == "ok"
    waits = [b - a for a, b in zip(calls, calls[1:])]
    assert len(calls) == 4 and waits[0] >= 0.01 and all(w >= 0.02 for w in waits[1:])


def test_a_transient_error_is_raised_after_the_bound_and_another_at_once():
    n = {"t": 0, "o": 0}

    def transient():
        n["t"] += 1
        raise Transient("locked")

    t = time.monotonic()
    with pytest.raises(Transient):
        retry_transient(transient, transient=lambda e: isinstance(e, Transient), within_s=0.2,
                        first_s=0.01, cap_s=0.05)
    assert 0.2 <= time.monotonic() - t < 2 and n["t"] > 2

    def other():
        n["o"] += 1
        raise ValueError("bad")

    with pytest.raises(ValueError):
        retry_transient(other, transient=lambda e: isinstance(e, Transient), within_s=5,
                        first_s=0.01, cap_s=0.05)
    assert n["o"] == 1

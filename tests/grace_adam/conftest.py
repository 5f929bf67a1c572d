"""Fixtures for the grace_adam tests."""

from __future__ import annotations

import pytest

import grace_adam
from grace_adam import _backend


@pytest.fixture
def isa_restore():
    """Restore the active ISA and the min-chunk knob after a test that changes them."""
    before = grace_adam.isa()
    yield
    if _backend.LIB is not None:
        _backend._force_isa(before)
        _backend._set_min_chunk(32768)

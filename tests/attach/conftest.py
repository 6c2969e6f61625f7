import pytest

from tests.attach.harness import near_check


@pytest.fixture
def near():
    """near(measured, independent, rel=0.25, abs_ms=2.0): measured within rel x independent + abs_ms."""
    return near_check

import pytest

from iosim.hardware import load_profile


@pytest.fixture(scope="session")
def h200():
    return load_profile("h200_sxm")


@pytest.fixture(scope="session")
def a100():
    return load_profile("a100_40gb")

"""Fixtures of the Python package's tests: the default model loaded once, the CLI binary and the
shared test data (tests/python_test.sh sets the environment)."""
import os
import subprocess
from pathlib import Path

import pytest

import squeezekv

CLI = os.environ.get("SQUEEZEKV_CLI", "")
SHARED = Path(os.environ.get("SQUEEZEKV_TEST_SHARED", Path(__file__).resolve().parents[3] / "shared"))
REF = Path(__file__).resolve().parents[1] / "ref"
EMMA = SHARED / "data" / "austen" / "emma.txt"


@pytest.fixture(scope="session")
def model():
    m = squeezekv.load(threads=2)
    yield m
    m.close()


@pytest.fixture(scope="session")
def model_f32():
    """The arithmetic of the CLI's eval commands (f32 decode activations)."""
    m = squeezekv.load(threads=2, decode_activations="f32")
    yield m
    m.close()


def cli(*args: str) -> subprocess.CompletedProcess:
    """The squeezekv binary of the same build, on the same default model."""
    assert CLI, "SQUEEZEKV_CLI is not set (tests/python_test.sh sets it)"
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=True)

"""The model tests build whole third-party models (tests/models/test_zoo.py):
a Keras model, its optimizer and their traced functions hold one another in
reference cycles, which only the cyclic collector frees. Collecting after each
test keeps a test worker from carrying every model it built into the tests
after it (one worker reached 12 GB and was killed for memory in CI)."""

import gc

import pytest


@pytest.fixture(autouse=True)
def collect_the_models_built():
    yield
    gc.collect()

import numpy as np
import pytest
import torch


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)

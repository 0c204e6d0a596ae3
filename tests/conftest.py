import numpy as np
import pytest
import torch

from _models import TINY, get_model
from structlens.models import load_model


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)


@pytest.fixture(params=TINY)
def tiny(request):
    return get_model(request.param)


@pytest.fixture
def llama():
    return get_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2-135m")

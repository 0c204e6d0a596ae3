import pytest

from _foundation import TINY, get_model
from structlens.models import load_model


@pytest.fixture(params=TINY)
def tiny(request):
    return get_model(request.param)


@pytest.fixture
def llama():
    return get_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2-135m")

import os

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


# In CI every optional test dependency is installed by `make test`; a test that would skip for a
# missing tool (TransformerLens, Playwright, chromium) fails there instead of passing unseen.
_MISSING_TOOL = ("is not installed", "no chromium")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    if any(s in reason for s in _MISSING_TOOL):
        report.outcome = "failed"
        report.longrepr = f"CI: a required test tool is missing: {reason}"

"""The worked examples of docs/architecture.md run as written."""

import re
import textwrap
from pathlib import Path

import pytest

from structlens.koopman.dictionaries import DICTIONARY_KINDS
from structlens.koopman.pipeline import DICTIONARIES
from structlens.sae.train import SAE_ARCHITECTURES

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_its_five_examples():
    assert len(BLOCKS) == 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that save write here
    registries = (DICTIONARIES, DICTIONARY_KINDS, SAE_ARCHITECTURES)
    before = [r.names() for r in registries]
    try:
        code = textwrap.dedent(BLOCKS[index])  # a block inside a list item is indented
        exec(compile(code, f"{DOC.name}[{index}]", "exec"), {"__name__": "example"})
    finally:
        # leave the global registries as they were for the other tests
        for reg, names in zip(registries, before, strict=True):
            for name in reg.names():
                if name not in names:
                    reg.unregister(name)


def test_unknown_names_list_the_registered_ones():
    from structlens.koopman.pipeline import make_dictionary
    from structlens.sae import SAETrainConfig

    with pytest.raises(ValueError, match=r"unknown dictionary 'quadratc'; choose from: identity"):
        make_dictionary("quadratc", 4)
    with pytest.raises(
        ValueError, match=r"unknown architecture 'plainl1'; choose from: relu, topk"
    ):
        SAETrainConfig(architecture="plainl1")

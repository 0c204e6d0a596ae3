import json
import sys
import types

import pytest

from structlens.data import corpus
from structlens.data.corpus import (
    Document,
    Prompt,
    chunk_documents,
    corpus_fingerprint,
    load_texts,
    prompts_fingerprint,
)


def test_bundled_corpus_is_prose_with_stable_unique_ids():
    docs = load_texts()
    assert docs == load_texts()
    ids = [d.id for d in docs]
    assert len(set(ids)) == len(ids) > 150
    total = sum(len(d.text) for d in docs)
    assert 300_000 <= total <= 600_000
    stems = {i.split("/")[0] for i in ids}
    assert len(stems) == 6  # six novels
    assert all(len(d.text) >= corpus.BUNDLED_DOC_CHARS for d in docs)
    joined = "\n".join(d.text for d in docs)
    for residue in ("_", "CHAPTER", "Chapter 1", "Gutenberg", "* * *"):
        assert residue not in joined
    assert (corpus.BUNDLED_DIR / "SOURCE.md").exists()
    assert load_texts(limit=5) == docs[:5]


def test_bundled_documents_reassemble_the_files():
    docs = load_texts()
    for file in sorted(corpus.BUNDLED_DIR.glob("*.txt")):
        paragraphs = [
            p.strip()
            for p in file.read_text(encoding="utf-8").split("\n\n")
            if p.strip() and p.strip() != "* * *"
        ]
        mine = [d for d in docs if d.id.startswith(file.stem + "/")]
        assert "\n\n".join(d.text for d in mine).split("\n\n") == paragraphs


def test_txt_file_splits_on_blank_lines(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("first doc\nline two\n\n \t\nsecond doc\n\n\n\nthird\n")
    docs = load_texts(f)
    assert docs == [
        Document("notes:0", "first doc\nline two"),
        Document("notes:1", "second doc"),
        Document("notes:2", "third"),
    ]
    assert load_texts(str(f), limit=2) == docs[:2]


def test_jsonl_ids_and_errors(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(
        json.dumps({"text": "alpha"}) + "\n\n" + json.dumps({"id": "x", "text": " beta "}) + "\n"
    )
    assert load_texts(f) == [Document("d:0", "alpha"), Document("x", "beta")]
    f.write_text("{not json}\n")
    with pytest.raises(ValueError, match="line 1"):
        load_texts(f)
    f.write_text(json.dumps({"body": "no text"}) + "\n")
    with pytest.raises(ValueError, match="'text'"):
        load_texts(f)
    f.write_text(json.dumps({"id": "a", "text": "1"}) + "\n" + json.dumps({"id": "a", "text": "2"}))
    with pytest.raises(ValueError, match="Duplicate"):
        load_texts(f)


def test_directory_one_document_per_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee\n")
    (tmp_path / "sub" / "a.txt").write_text("ay")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "skip.md").write_text("not text")
    assert load_texts(tmp_path) == [Document("b.txt", "bee"), Document("sub/a.txt", "ay")]


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_texts(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(ValueError, match="No non-empty documents"):
        load_texts(empty)
    other = tmp_path / "x.csv"
    other.write_text("a,b")
    with pytest.raises(ValueError, match="Unsupported"):
        load_texts(other)
    with pytest.raises(ValueError, match="limit"):
        load_texts(limit=0)
    with pytest.raises(ValueError, match="Malformed"):
        load_texts("hf:")


def test_hf_source_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="structlens\\[datasets\\]"):
        load_texts("hf:wikitext:wikitext-2-raw-v1:train")


def test_hf_source_through_a_fake_datasets_module(monkeypatch):
    calls = []

    class FakeDataset:
        column_names = ["text"]

        def __getitem__(self, key):
            assert key == "text"
            return ["one", "", "  ", "two"]

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        if name == "offline/thing":
            raise ConnectionError("no network")
        return FakeDataset()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    docs = load_texts("hf:some/data::validation", limit=4)
    assert calls[-1] == ("some/data", None, "validation[:4]")
    assert docs == [
        Document("hf:some/data:validation:0", "one"),
        Document("hf:some/data:validation:3", "two"),
    ]
    load_texts("hf:some/data:cfg")
    assert calls[-1] == ("some/data", "cfg", "train")
    with pytest.raises(RuntimeError, match="offline"):
        load_texts("hf:offline/thing")


def test_chunking_covers_the_token_stream(word_tok):
    docs = [
        Document("d0", " ".join(["Mary and John went to the store ."] * 7)),
        Document("d1", "the war"),
        Document("d2", " ".join(["the capital of France is Paris ."] * 3)),
    ]
    prompts = chunk_documents(docs, word_tok, max_tokens=10, min_tokens=3)
    assert prompts == chunk_documents(docs, word_tok, max_tokens=10, min_tokens=3)
    assert all(3 <= len(p.token_ids) <= 10 for p in prompts)
    for d in docs:
        full = word_tok(d.text, add_special_tokens=False)["input_ids"]
        mine = [p for p in prompts if p.id.startswith(d.id + "#")]
        assert [p.id for p in mine] == [f"{d.id}#{k}" for k in range(len(mine))]
        stream = [t for p in mine for t in p.token_ids]
        assert stream == full[: len(stream)]
        assert len(full) - len(stream) < 3  # only a short tail is dropped
    with_bos = chunk_documents(docs, word_tok, max_tokens=10, min_tokens=3, prepend_bos=True)
    assert all(p.token_ids[0] == word_tok.bos_token_id and len(p.token_ids) <= 10 for p in with_bos)
    assert [t for p in with_bos if p.id.startswith("d0#") for t in p.token_ids[1:]] == (
        word_tok(docs[0].text, add_special_tokens=False)["input_ids"]
    )
    assert len(chunk_documents(docs, word_tok, max_tokens=10, max_prompts=4)) == 4


def test_chunking_errors(word_tok):
    docs = [Document("d", "the war")]
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_documents(docs, word_tok, max_tokens=1)
    with pytest.raises(ValueError, match="min_tokens"):
        chunk_documents(docs, word_tok, max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="No prompts"):
        chunk_documents(docs, word_tok, max_tokens=4, min_tokens=3)

    class NoBos:
        bos_token_id = None

    with pytest.raises(ValueError, match="bos"):
        chunk_documents(docs, NoBos(), max_tokens=4, prepend_bos=True)
    # The default minimum is min(8, max_tokens): 5 tokens give one 4-token prompt.
    five = [Document("d", "the war lasted from the")]
    assert [len(p.token_ids) for p in chunk_documents(five, word_tok, max_tokens=4)] == [4]


def test_fingerprints_track_content():
    a = [Document("x", "hello"), Document("y", "world")]
    assert corpus_fingerprint(a) == corpus_fingerprint(list(a))
    assert corpus_fingerprint(a) != corpus_fingerprint(a[::-1])
    assert corpus_fingerprint(a) != corpus_fingerprint([Document("x", "hello!"), a[1]])
    assert corpus_fingerprint(a) != corpus_fingerprint([Document("z", "hello"), a[1]])
    # Length prefixes: moving characters between id and text changes the hash.
    assert corpus_fingerprint([Document("a", "bc")]) != corpus_fingerprint([Document("ab", "c")])
    p = [Prompt("x#0", [1, 2, 3])]
    assert prompts_fingerprint(p) != prompts_fingerprint([Prompt("x#0", [1, 2, 4])])
    assert prompts_fingerprint(p) != prompts_fingerprint([Prompt("x#0", [1, 2]), Prompt("", [3])])
    assert len(corpus_fingerprint(a)) == 64

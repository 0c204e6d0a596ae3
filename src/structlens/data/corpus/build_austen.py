"""Rebuild the bundled corpus from Debian's ``r-cran-janeaustenr`` package (provenance script).

Run once by hand; the wheel ships only the ``.txt`` files it writes.  Usage::

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python build_austen.py pkg/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb

The R lazy-load database holds one zlib-compressed, XDR-serialised character vector (one
element per line of the Project Gutenberg text) per novel.  We parse just that subset of R's
serialisation format, keep the first chapters of each novel up to ``TARGET_CHARS``, drop
chapter/volume headings and typographic separators, remove the ``_italics_`` underscores,
unwrap hard-wrapped lines into paragraphs and normalise whitespace.  Output format: one
paragraph per line, a blank line between paragraphs, and a line ``* * *`` between chapters.
"""

from __future__ import annotations

import re
import struct
import sys
import zlib
from pathlib import Path

TARGET_CHARS = 85_000
_HEADING = re.compile(r"^\s*(chapter|volume)\s+[0-9ivxlc]+\.?\s*$", re.IGNORECASE)
_SEPARATOR = re.compile(r"^[\s*]+$")
_STEMS = {
    "EMMA": "austen_emma",
    "MANSFIELD PARK": "austen_mansfield_park",
    "NORTHANGER ABBEY": "austen_northanger_abbey",
    "PERSUASION": "austen_persuasion",
    "PRIDE AND PREJUDICE": "austen_pride_and_prejudice",
    "SENSE AND SENSIBILITY": "austen_sense_and_sensibility",
}


def _decode_character_vector(buf: bytes) -> list[str] | None:
    """Decode one XDR-serialised R object if it is a character vector (STRSXP), else None."""
    p = 2  # skip the "X\n" (XDR) format marker

    def i32() -> int:
        nonlocal p
        (v,) = struct.unpack(">i", buf[p : p + 4])
        p += 4
        return v

    version = i32()
    i32(), i32()  # writer's and minimal reader's R versions
    if version == 3:
        n_enc = i32()
        p += n_enc  # skip the native encoding name
    if i32() & 0xFF != 16:
        return None
    lines = []
    for _ in range(i32()):
        i32()  # CHARSXP flags
        n = i32()
        lines.append("" if n < 0 else buf[p : p + n].decode("utf-8"))
        p += max(n, 0)
    return lines


def read_character_vectors(rdb: bytes) -> list[list[str]]:
    """Decode every record of an R lazy-load database that is a plain character vector.

    Records are a 4-byte length followed by a zlib stream, back to back.
    """
    out: list[list[str]] = []
    pos = 0
    while pos < len(rdb):
        dec = zlib.decompressobj()
        lines = _decode_character_vector(dec.decompress(rdb[pos + 4 :]))
        pos = len(rdb) - len(dec.unused_data)
        if lines is not None:
            out.append(lines)
    return out


def chapters(lines: list[str]) -> list[list[str]]:
    """Split a novel into chapters of cleaned paragraphs; front matter is dropped."""
    result: list[list[str]] = []
    para: list[str] = []
    current: list[str] | None = None

    def flush() -> None:
        if para and current is not None:
            text = re.sub(r"\s+", " ", " ".join(para).replace("_", "")).strip()
            if text:
                current.append(text)
        para.clear()

    for line in lines:
        if _HEADING.match(line):
            flush()
            if line.strip().lower().startswith("chapter"):
                current = []
                result.append(current)
        elif not line.strip() or _SEPARATOR.match(line):
            flush()
        else:
            para.append(line.strip())
    flush()
    return [c for c in result if c]


def main(rdb_path: str) -> None:
    out_dir = Path(__file__).parent
    for lines in read_character_vectors(Path(rdb_path).read_bytes()):
        stem = _STEMS[lines[0].strip().upper()]
        kept: list[str] = []
        size = 0
        for chapter in chapters(lines):
            if size >= TARGET_CHARS:
                break
            kept.append("\n\n".join(chapter))
            size += sum(len(p) for p in chapter)
        (out_dir / f"{stem}.txt").write_text("\n\n* * *\n\n".join(kept) + "\n", encoding="utf-8")
        print(f"{stem}: {len(kept)} chapters, {size} characters")


if __name__ == "__main__":
    main(sys.argv[1])

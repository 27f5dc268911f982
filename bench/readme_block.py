"""The one place where a benchmark writes its results into bench/README.md: between its begin/end markers, or, the
first time, appended as a new section."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def write_block(begin: str, end: str, block: str, new_section: str) -> None:
    """Replace the text from ``begin`` to ``end`` (markers included; ``block`` carries them) with ``block``; when the
    README has no such markers yet, append ``new_section`` (a heading and an introduction) and the block."""
    text = README.read_text()
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text += "\n" + new_section + block + "\n"
    README.write_text(text)

"""MANIFEST.md Appendix A, parsed: per sample, the partition dirs left out of the corpus ("omitted") and
the dirs whose preallocated active-segment indexes are absent (files of 4 MiB or more were not copied).
These are the corpus's explanations for checkpoint entries without a directory, assigned replicas
without a directory, and logs without an index."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SampleAppendix:
    omitted: set[str] = field(default_factory=set)  # "<log dir>/<partition dir>" relative to the sample
    absent_index_dirs: set[str] = field(default_factory=set)  # same form
    absent_files: set[str] = field(default_factory=set)  # file paths relative to the sample


def _expand(spec: str) -> list[str]:
    """'__consumer_offsets-{5-11,13}' -> ['__consumer_offsets-5', ..., '__consumer_offsets-13']."""
    m = re.fullmatch(r"(.*)\{([0-9,\-]+)\}", spec)
    if not m:
        return [spec]
    out = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}{n}" for n in range(int(lo), int(hi or lo) + 1)]
    return out


def appendix(corpus: Path) -> dict[str, SampleAppendix]:
    text = (corpus / "MANIFEST.md").read_text(encoding="utf-8")
    section = text.split("## Appendix A", 1)[1]
    out: dict[str, SampleAppendix] = {}
    current: SampleAppendix | None = None
    for line in section.splitlines():
        if line.startswith("### "):
            current = out.setdefault(line[4:].strip(), SampleAppendix())
            continue
        if current is None or not line.startswith("- "):
            continue
        m = re.match(r"- omitted under `([^`]+)/`: (\S+) \(\d+ dirs\)", line)
        if m:
            current.omitted.update(f"{m.group(1)}/{name}" for name in _expand(m.group(2)))
            continue
        if line.startswith("- absent preallocated"):
            current.absent_index_dirs.update(re.findall(r"`([^`]+)`", line.split(" in: ", 1)[1]))
        elif line.startswith("- absent other files"):
            current.absent_files.update(re.findall(r"`([^`]+)`", line))
    return out

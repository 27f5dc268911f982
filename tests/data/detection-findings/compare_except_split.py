"""Two directories of recorded findings agree on every row but topic-id-split's (issue 16 re-recorded only those).

Usage: python compare_except_split.py OLD_DIR NEW_DIR
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def is_split(line: str) -> bool:
    return json.loads(line).get("rule") == "topic-id-split"


def main(old_dir: Path, new_dir: Path) -> None:
    for name in ("mutated", "pristine", "kraft"):
        old, new = lines(old_dir / f"{name}.jsonl.gz"), lines(new_dir / f"{name}.jsonl.gz")
        other_old, other_new = [x for x in old if not is_split(x)], [x for x in new if not is_split(x)]
        if other_old != other_new:
            sys.exit(f"{name}: rows of other rules differ ({len(other_old)} before, {len(other_new)} now)")
        split_old, split_new = len(old) - len(other_old), len(new) - len(other_new)
        same = f"{len(other_old)} other rows identical, in the same order"
        print(f"{name}: {same}; topic-id-split rows {split_old} -> {split_new}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

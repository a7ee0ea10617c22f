"""A stand-in for `python -m harness` in the bench's cold-start tests: `warmup` "compiles" two variants
into --cache-dir (none when they are there), `check` needs them; each logs its call and whether a
compile-cache variable reached it from the parent's environment. FAKE_WARMUP_EXIT: warmup's status."""

from __future__ import annotations

import os
import sys
from pathlib import Path

LEAKED = ("TORCHINDUCTOR_CACHE_DIR", "ATTN_HARNESS_CACHE", "ATTN_HARNESS_CACHE_VARS")


def main(argv: list[str]) -> int:
    command, cache = argv[0], Path(argv[argv.index("--cache-dir") + 1])
    fake = cache / "fake"
    fake.mkdir(parents=True, exist_ok=True)
    leaked = [v for v in LEAKED if v in os.environ]
    with (fake.parent.parent / "calls.log").open("a") as log:
        log.write(f"{command} {' '.join(argv[1:])} leaked={','.join(leaked)}\n")
    if command == "warmup":
        todo = [v for v in ("a", "b") if not (fake / v).exists()]
        for v in todo:
            (fake / v).write_text("x" * 1000)
        print("library  variants  compiled")
        print(f"fake  2  {len(todo)}")
        print(f"warmup: {len(todo)} variants compiled into {cache}" if todo else "warmup: nothing compiled")
        return int(os.environ.get("FAKE_WARMUP_EXIT", "0"))
    return 0 if all((fake / v).exists() for v in ("a", "b")) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

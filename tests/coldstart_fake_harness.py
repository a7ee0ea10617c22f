"""A stand-in for `python -m harness` in the bench's cold-start tests: `check` "compiles" two variants
into --cache-dir beside itself (none when they are there), printing the warm-up's lines as a CUDA
check does, and passes only if both are there; it logs its call and whether a compile-cache
variable reached it from the parent's environment. FAKE_WARMUP_FAILED: variants that fail to
compile; FAKE_CHECK_EXIT: the check's status. Its "compile" burns BURN_SECONDS of CPU in a child
process it waits for, and writes the CPU that child used to cpu.log beside the cache. With --results
it writes a results.json as a parallel check does: PARTS parts of PART_SECONDS each, dealt round the
GPUs of --gpus, JOBS_PER_GPU at once on each, each part and the plan expected at PART_SECONDS a part,
the check's elapsed seconds ELAPSED_SECONDS, its cases' own seconds a CASES_SHARE of its own
(FAKE_ONE_PROCESS=1: as one pytest process, no parts; FAKE_MISPLANNED=N: the first N checks on one
GPU planned their longest part at MISPLANNED_SECONDS)."""

import os
import subprocess
import sys
from pathlib import Path

LEAKED = ("TORCHINDUCTOR_CACHE_DIR", "ATTN_HARNESS_CACHE", "ATTN_HARNESS_CACHE_VARS")
BURN_SECONDS = 0.3
PARTS = 6
PART_SECONDS = 10.0
JOBS_PER_GPU = 2
CASES_SHARE = (0.5, 0.6)  # of a part's seconds, its cases' own: on one GPU, on several (20 % slower)
MISPLANNED_SECONDS = 5.0
ELAPSED_SECONDS = 0.05  # in its results (its command takes longer)
BURN = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    "print(time.process_time())"
)


def main(argv: list[str]) -> int:
    command, cache = argv[0], Path(argv[argv.index("--cache-dir") + 1])
    fake = cache / "fake"
    fake.mkdir(parents=True, exist_ok=True)
    leaked = [v for v in LEAKED if v in os.environ]
    calls = fake.parent.parent / "calls.log"
    with calls.open("a") as log:
        log.write(f"{command} {' '.join(argv[1:])} leaked={','.join(leaked)}\n")
    todo = [v for v in "ab" if not (fake / v).exists()]
    for v in todo:
        (fake / v).write_text("x" * 1000)
    burn = [sys.executable, "-c", BURN.format(s=BURN_SECONDS)]
    burned = subprocess.run(burn, capture_output=True, text=True)
    with (calls.parent / "cpu.log").open("a") as log:
        log.write(burned.stdout)
    failed = int(os.environ.get("FAKE_WARMUP_FAILED", "0"))
    print("warmup: beside the check: fake, 2 cores")
    print("library  variants  compiled")
    print(f"fake  2  {len(todo)}")
    tail = f"; {failed} failed" if failed else ""
    print(f"warmup: {len(todo)} variants compiled in 3 s beside the check{tail}")
    print("decode  10 pass")
    if "--results" in argv:
        gpus = argv[argv.index("--gpus") + 1].split(",")
        logged = [c.split(" --gpus ")[1].split()[0] for c in calls.read_text().split("\n") if " --gpus " in c]
        ones = sum("," not in g for g in logged)  # checks on one GPU so far, this one included
        misplanned = len(gpus) == 1 and ones <= int(os.environ.get("FAKE_MISPLANNED", "0"))
        _results(Path(argv[argv.index("--results") + 1]), gpus, misplanned)
    return int(os.environ.get("FAKE_CHECK_EXIT", "0"))


def _results(path: Path, gpus: list[str], misplanned: bool) -> None:
    from harness.report import results_json

    seconds = [PART_SECONDS + i * 5 % PARTS for i in range(PARTS)]  # the longest is not the last
    share = CASES_SHARE[min(len(gpus), 2) - 1]
    longest = MISPLANNED_SECONDS if misplanned else PART_SECONDS
    parts = [
        {"part": f"fake[{i}/{PARTS}]", "gpu": gpus[i % len(gpus)], "seconds": s,
         "expected_s": longest if s == max(seconds) else PART_SECONDS, "cases_s": s * share}
        for i, s in enumerate(seconds)
    ]
    jobs = JOBS_PER_GPU * len(gpus)
    run = {"command": "python -m harness check"}
    if os.environ.get("FAKE_ONE_PROCESS") != "1":
        run.update(jobs=jobs, expected_s=PART_SECONDS * PARTS / jobs, elapsed_s=ELAPSED_SECONDS, parts=parts)
    results_json.dump(path, results_json.build([], run, {}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

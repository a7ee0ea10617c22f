"""The warm-up beside the check: a CUDA `check` compiles its JIT variants (harness/run/speed/warmup/) while
it checks, instead of before.

Each backend's pytest processes start once every JIT library it draws from has ended its warm-up;
the other backends (torch_native, torch_split, flex_eager) start at once, so they run while
FlashInfer's ninja builds. A variant that fails to compile is reported, not fatal: the check meets
the same compile and gives its verdict on that backend's cases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from harness.run.speed import warmup


class WarmGate:
    """The warm-up of `backends`' libraries in a thread; `ready(backend)` says whether that backend's
    parts may start (every library it draws from has ended, however it ended)."""

    def __init__(
        self,
        libraries: Sequence[warmup.Library],
        profile: str,
        jobs: int,
        backends: Sequence[str],
        say: Callable[[str], None] = print,
    ) -> None:
        self.chosen = warmup.select(libraries, backends)
        self.profile, self.jobs, self.backends, self.say = profile, jobs, list(backends), say
        self.tallies: list[warmup.Tally] = []
        self.error: str | None = None
        self.seconds: float | None = None  # from start() to the last library's end
        self._lock = threading.Lock()
        self._pending = {lib.name for lib in self.chosen}
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self) -> None:
        """Open the gate at once for each library its stamp says is warm (a restored cache: the
        parts then start in the plan's order, longest first), and warm up the others in a thread."""
        self._t0 = time.monotonic()
        if self.chosen:
            names = ", ".join(lib.name for lib in self.chosen)
            self.say(f"warmup: beside the check: {names}, {self.jobs} cores")
        warm: list[warmup.Tally] = []
        rest: list[warmup.Library] = []
        for lib in self.chosen:
            try:
                tally = warmup.stamped(lib, self.profile, self.backends, self.say)
            except Exception:  # noqa: BLE001 - the thread meets it again, and says so
                tally = None
            if tally is None:
                rest.append(lib)
            else:
                warm.append(tally)
                self._done(lib, tally)
        run = threading.Thread(target=self._run, args=(rest, warm), name="attn-harness-warmup", daemon=True)
        self._thread = run
        run.start()

    def _run(self, rest: list[warmup.Library], warm: list[warmup.Tally]) -> None:
        try:
            ran = warmup.run(rest, self.profile, self.jobs, self.say, self.backends, done=self._done)
            by_library = {t.library: t for t in [*warm, *ran]}
            self.tallies = [by_library[lib.name] for lib in self.chosen]
        except Exception as e:  # noqa: BLE001 - the check goes on without the warm-up, and says so
            self.error = f"{type(e).__name__}: {e}"
            self.say(f"warmup: stopped: {self.error}; the check compiles what it needs itself")
        finally:
            with self._lock:
                self._pending.clear()
            self.seconds = time.monotonic() - self._t0

    def _done(self, library: warmup.Library, tally: warmup.Tally) -> None:
        with self._lock:
            self._pending.discard(library.name)
        what = f"skipped ({tally.skipped})" if tally.skipped else (
            f"{tally.compiled} compiled, {tally.cached} cached, {len(tally.failed)} failed"
        )
        self.say(f"warmup: {library.name} done in {time.monotonic() - self._t0:.0f} s: {what}")

    def ready(self, backend: str) -> bool:
        with self._lock:
            return not any(lib.name in self._pending and backend in lib.backends for lib in self.chosen)

    def nice(self) -> int:
        """How much lower a check process started now runs: warmup.BESIDE_NINJA_NICE while a ninja
        build (FlashInfer's, the longest chain of a cold run) is still pending, else 0."""
        with self._lock:
            building = any(lib.plan is not None and lib.name in self._pending for lib in self.chosen)
        return warmup.BESIDE_NINJA_NICE if building else 0

    def compiled(self) -> int:
        """Variants the warm-up compiled (so far)."""
        return sum(t.compiled for t in self.tallies)

    def join(self) -> list[str]:
        """Wait for the warm-up (the check's parts may all have ended first); its summary lines."""
        if self._thread is not None:
            self._thread.join()
        if not self.chosen:
            return []
        lines = warmup.summary(self.tallies, "the cache directory")[:-1] if self.tallies else []
        took = f"{self.seconds:.0f} s" if self.seconds is not None else "unfinished"
        failed = sum(len(t.failed) for t in self.tallies)
        lines.append(
            f"warmup: {self.compiled()} variants compiled in {took} beside the check"
            + (f"; {failed} failed (their backends' checks report what they meet)" if failed else "")
            + (f"; stopped: {self.error}" if self.error else "")
        )
        return lines

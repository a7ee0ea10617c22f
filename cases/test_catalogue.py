"""The catalogue (harness/search/catalogue.py): every backend runs the named batches first.

One test per backend, device and entry, before the searches: pytest collects this file ahead of the
family files (test_catalogue sorts first) and the plugin's reordering keeps that order. An entry the
backend does not declare is skipped with its `supports()` reason; every other one is checked against
the references like any drawn case, and a failure prints its repro command.

Ids read `test_catalogue[<backend>-<device>-<entry>]` and carry the backend and `gpu` markers only:
no entry name holds a family keyword or `swa`, so `-k decode` and `-k swa` still select exactly the
searches, and `-k <backend>` selects these too.
"""

import pytest

from harness import backends
from harness.core.modes import family_of
from harness.run import isolation
from harness.search.catalogue import CATALOGUE, entry


def _params() -> list:
    out = []
    for name in backends.selected():
        for device in sorted(backends.load(name).capabilities.devices):
            marks = [getattr(pytest.mark, name)] if name.isidentifier() else []  # a spec is no marker
            marks += [pytest.mark.gpu] if device == "cuda" else []
            for e in CATALOGUE:
                out.append(pytest.param(name, device, e.name, id=f"{name}-{device}-{e.name}", marks=marks))
    return out


@pytest.mark.parametrize(("backend_name", "device", "entry_name"), _params())
def test_catalogue(backend_name, device, entry_name, record):
    backend = backends.load(backend_name)
    why = backend.available(device)
    if why:
        pytest.skip(why)
    e = entry(entry_name)
    why = backend.supports(e.case)
    if why:
        pytest.skip(f"{e.name}: {why}")
    family = family_of(e.case.mode, [r.prefix_len for r in e.case.requests])
    result = isolation.Search(backend, device, family=family)(e.case)
    record(result)
    if result.status not in ("pass", "xfail"):
        raise AssertionError(f"catalogue entry {e.name} ({e.models}):\n{result.failure_text()}")

"""Small builders shared by the self-tests."""

from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request


def case(mode="EXTEND", reqs=((3, 4),), **kw) -> Case:
    """A Case from (prefix, extend[, encoder[, tree]]) tuples."""
    return Case(mode=mode, requests=tuple(Request(*r) for r in reqs), **kw)


def batch_of(c: Case, whole_page_loads: bool = False):
    return build_batch(c, make_inputs(c), "cpu", whole_page_loads)

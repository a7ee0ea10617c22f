"""Case: JSON round-trip and every validation message."""

import json

import pytest
from hypothesis import given, settings

from harness.backends import load
from harness.core.case import Case, CaseError, Request
from harness.core.modes import FAMILIES
from harness.search.profiles import SIZES
from harness.search.strategies import cases


def ext(**kw):
    return Case(mode="EXTEND", requests=(Request(3, 4),), **kw)


@settings(max_examples=30)
@given(cases("verify", True, load("torch_native").capabilities, SIZES["ci"]))
def test_json_round_trip_verify(case):
    again = Case.from_json(case.to_json())
    assert again == case
    assert again.to_json() == case.to_json()


@pytest.mark.parametrize("family", FAMILIES)
def test_json_round_trip_every_family(family):
    from hypothesis import find

    case = find(
        cases(family, False, load("torch_native").capabilities, SIZES["ci"]), lambda c: c.batch_size >= 2
    )
    assert Case.from_dict(json.loads(case.to_json())) == case


BAD = [
    (dict(num_q_heads=6, num_kv_heads=4), "num_q_heads=6 is not a multiple of num_kv_heads=4"),
    (dict(num_kv_heads=0), "num_kv_heads=0 must be >= 1"),
    (dict(head_dim=60), "head_dim=60 must be a multiple of 8"),
    (dict(head_dim=1024), "head_dim=1024 must be in [8, 512]"),
    (dict(dtype="float64"), "dtype='float64' is not one of bfloat16, float16, float32"),
    (dict(window_left=-2), "window_left=-2 must be >= -1"),
    (dict(window_right=-2), "window_right=-2 must be >= -1"),
    (dict(window_right=True), "window_right=True must be an integer"),
    (dict(window_left=3, window_right=2), "window_right=2 is only meaningful in ENCODER_ONLY, not EXTEND"),
    (dict(soft_cap=-1.0), "soft_cap=-1.0 must be finite and >= 0"),
    (dict(soft_cap="x"), "soft_cap='x' must be a number"),
    (dict(sm_scale=0.0), "sm_scale=0.0 must be a positive number or null"),
    (dict(page_size=8), "page_size=8 is not one of 1, 16, 32, 64, 128"),
    (dict(page_layout="random"), "page_layout='random' is not one of contiguous"),
    (dict(kv_layout="NDH"), "kv_layout='NDH' is not one of NHD, HND"),
    (dict(sinks=1), "sinks=1 must be true or false"),
    (dict(hybrid_swa_pool=True), "hybrid_swa_pool=true needs window_left >= 0"),
    (dict(swa_pool_exact=True, window_left=3), "swa_pool_exact=true needs hybrid_swa_pool=true"),
    (dict(q_amplitude=0), "q_amplitude=0 must be in (0, 1000]"),
    (dict(seed=-1), "seed=-1 must be in [0,"),
    (dict(seed=1.5), "seed=1.5 must be an integer"),
    (dict(kv_dtype="float8"), "kv_dtype='float8' is not one of float8_e4m3fn, float8_e5m2"),
    (dict(kv_dtype="float8_e4m3fn", k_scale=0.0), "k_scale=0.0 must be a positive finite number"),
    (dict(kv_dtype="float8_e4m3fn", v_scale=float("inf")), "v_scale=inf must be a positive finite number"),
    (dict(kv_dtype="float8_e5m2", k_scale=float("nan")), "k_scale=nan must be a positive finite number"),
    (dict(kv_dtype="float8_e5m2", v_scale=True), "v_scale=True must be a positive finite number"),
    (dict(kv_dtype="float8_e5m2", v_scale="1"), "v_scale='1' must be a positive finite number"),
    (dict(kv_dtype="float8_e4m3fn", k_scale=1e-40), "k_scale=1e-40 must be a positive finite number in"),
    (dict(k_scale=0.5), "k_scale=0.5 is only meaningful with an FP8 kv_dtype"),
    (dict(v_scale=2), "v_scale=2 is only meaningful with an FP8 kv_dtype"),
]


@pytest.mark.parametrize("kw,message", BAD, ids=[m.split("=")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_batch_field_messages(kw, message):
    with pytest.raises(CaseError) as e:
        ext(**kw)
    assert message in str(e.value)


REQUEST_BAD = [
    ("EXTEND", [Request(-1, 4)], {}, "requests[0].prefix_len=-1 must be >= 0"),
    ("EXTEND", [Request(0, 0)], {}, "requests[0].extend_len=0 must be >= 1"),
    ("DECODE", [Request(5, 1), Request(5, 2)], {}, "requests[1].extend_len=2 must be 1 in DECODE"),
    ("CROSS", [Request(0, 3)], {}, "requests[0].encoder_len=0 must be >= 1 in CROSS"),
    ("EXTEND", [Request(0, 3, encoder_len=4)], {}, "encoder_len=4 is only meaningful in CROSS"),
    ("CROSS", [Request(0, 3, encoder_len=4)], {"window_left": 5}, "window_left=5 has no meaning in CROSS"),
    ("TARGET_VERIFY", [Request(4, 3)], {}, "requests[0].tree is required in TARGET_VERIFY"),
    ("TARGET_VERIFY", [Request(4, 3, tree=(-1, 0))], {}, "tree has 2 nodes but extend_len=3"),
    ("TARGET_VERIFY", [Request(4, 3, tree=(-1, 2, 0))], {}, "requests[0].tree[1]=2 must be -1 or the index"),
    ("EXTEND", [Request(4, 3, tree=(-1, 0, 1))], {}, "tree is only meaningful in TARGET_VERIFY"),
    (
        "DRAFT_EXTEND_V2",
        [Request(4, 3), Request(4, 2)],
        {},
        "requests[1].extend_len=2 differs from requests[0].extend_len=3",
    ),
    (
        "TARGET_VERIFY",
        [Request(4, 2, tree=(-1, 0)), Request(4, 3, tree=(-1, 0, 0))],
        {},
        "one num_draft for the whole batch",
    ),
    ("ENCODER_ONLY", [Request(0, 4), Request(2, 3)], {}, "requests[1].prefix_len=2 must be 0 in ENCODER"),
    ("ENCODER_ONLY", [Request(0, 4)], {"window_right": 2}, "window_right=2 needs window_left >= 0"),
    ("ENCODER_ONLY", [Request(0, 3, encoder_len=4)], {}, "encoder_len=4 is only meaningful in CROSS"),
    ("EXTEND", [], {}, "requests is empty"),
    ("PREFILL", [Request(0, 1)], {}, "mode='PREFILL' is not one of DECODE, EXTEND"),
]


@pytest.mark.parametrize(
    "mode,reqs,kw,message", REQUEST_BAD, ids=[f"req{i}" for i in range(len(REQUEST_BAD))]
)
def test_request_messages(mode, reqs, kw, message):
    with pytest.raises(CaseError) as e:
        Case(mode=mode, requests=tuple(reqs), **kw)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "a Case is a JSON object, got list"),
        ('{"mode": "EXTEND"}', "Case field 'requests' is missing"),
        (
            '{"mode": "EXTEND", "requests": [{"prefix_len": 1, "extend_len": 1}], "colour": 1}',
            "unknown Case field(s): colour",
        ),
        ('{"mode": "EXTEND", "requests": [{"prefix": 1}]}', "requests[0] has unknown field(s): prefix"),
        ('{"mode": "EXTEND", "requests": 3}', "requests=3 must be a list"),
        ('{"mode": "TARGET_VERIFY", "requests": [{"extend_len": 2, "tree": 5}]}', "tree=5 must be a list"),
    ],
)
def test_json_messages(text, message):
    with pytest.raises(CaseError) as e:
        Case.from_json(text)
    assert message in str(e.value)


def test_scale_defaults_to_inverse_sqrt_head_dim():
    assert ext(head_dim=64).scale == pytest.approx(0.125)
    assert ext(head_dim=64, sm_scale=0.3).scale == 0.3


def test_an_encoder_case_with_a_two_sided_window_is_valid_and_round_trips():
    c = Case(mode="ENCODER_ONLY", requests=(Request(0, 9), Request(0, 2)), window_left=3, window_right=1)
    assert Case.from_json(c.to_json()) == c and json.loads(c.to_json())["window_right"] == 1
    assert Case.from_dict({"mode": "EXTEND", "requests": [{"extend_len": 2}]}).window_right == -1


def test_fp8_fields_appear_in_json_only_with_an_fp8_cache():
    plain = ext()
    assert not {"kv_dtype", "k_scale", "v_scale"} & set(plain.to_dict())  # JSON as before FP8 caches
    assert Case.from_json(plain.to_json()) == plain
    fp8 = ext(kv_dtype="float8_e5m2", k_scale=0.0173, v_scale=3.7)
    d = fp8.to_dict()
    assert (d["kv_dtype"], d["k_scale"], d["v_scale"]) == ("float8_e5m2", 0.0173, 3.7)
    assert Case.from_json(fp8.to_json()) == fp8
    assert ext(kv_dtype="float8_e4m3fn").k_scale == 1.0  # FlashInfer's default too

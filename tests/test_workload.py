import pytest
from hypothesis import given, settings, strategies as st

from iosim.errors import IosimError
from iosim.workload import AttentionConfig, sum_keys_seen


def test_default_is_the_papers_gpt2_medium_layer():
    c = AttentionConfig()
    assert (c.batch, c.heads, c.seqlen_q, c.seqlen_k, c.head_dim, c.dtype) == (64, 16, 1024, 1024, 64, "fp16")
    assert c.kv_heads == 16 and not c.causal and c.pass_ == "forward"
    assert c.tensor_bytes()["Q"] == 64 * 16 * 1024 * 64 * 2


@pytest.mark.parametrize("kw, words", [
    (dict(batch=0), "field 'batch' = 0"),
    (dict(head_dim=-64), "field 'head_dim' = -64"),
    (dict(heads=16, kv_heads=5), "heads (16) must be a multiple of kv_heads (5)"),
    (dict(dtype="int8"), "field 'dtype'"),
    (dict(**{"pass": "sideways"}), "field 'pass'"),
    (dict(seqlen_q=10, nonsense=1), "nonsense"),
])
def test_bad_configs_give_one_line(kw, words):
    with pytest.raises(IosimError) as e:
        AttentionConfig.make(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=200, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), causal=st.booleans(), data=st.data())
def test_sum_keys_seen_closed_form_equals_counting(nq, nk, causal, data):
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=nq, seqlen_k=nk, causal=causal)
    lo = data.draw(st.integers(0, nq))
    hi = data.draw(st.integers(lo, nq))
    assert sum_keys_seen(cfg, lo, hi) == sum(cfg.keys_seen(r) for r in range(lo, hi))


def test_causal_is_bottom_right_aligned():
    c = AttentionConfig(batch=1, heads=1, seqlen_q=4, seqlen_k=6, causal=True)
    assert [c.keys_seen(r) for r in range(4)] == [3, 4, 5, 6]
    c = AttentionConfig(batch=1, heads=1, seqlen_q=6, seqlen_k=4, causal=True)
    assert [c.keys_seen(r) for r in range(6)] == [0, 0, 1, 2, 3, 4]   # first rows see no key

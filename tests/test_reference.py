"""The tiled algorithm in numpy (the CUDA kernels' logic, block for block) equals exact attention."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gpu_kernels.reference import causal_mask, reference_attention, tiled_attention


def close(a, b):
    return np.allclose(a, b, rtol=1e-12, atol=1e-12)


def check(q, k, v, bq, bkv, causal):
    o, lse = reference_attention(q, k, v, causal)
    for order in ("flash1", "flash2"):
        o2, lse2 = tiled_attention(q, k, v, bq, bkv, order, causal)
        assert close(o, o2), order
        assert (np.isinf(lse) == np.isinf(lse2)).all()
        assert close(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(lse2), 0, lse2))
        assert np.isfinite(o2).all()


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.sampled_from([1, 2]), nq=st.integers(1, 70),
       nk=st.integers(1, 70), d=st.sampled_from([1, 4, 16]), bq=st.sampled_from([1, 8, 16, 64]),
       bkv=st.sampled_from([1, 8, 16, 64]), causal=st.booleans(), seed=st.integers(0, 2**31))
def test_tiled_equals_exact_on_random_inputs(b, hkv, g, nq, nk, d, bq, bkv, causal, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hkv * g, nq, d))
    k, v = rng.standard_normal((2, b, hkv, nk, d))
    check(q, k, v, bq, bkv, causal)


@pytest.mark.parametrize("nq, nk", [(1, 1), (37, 100), (100, 37), (64, 64), (65, 63)])
def test_adversarial_logits_of_1e4_and_fully_masked_rows(nq, nk):
    rng = np.random.default_rng(1)
    q = rng.choice([-1.0, 1.0], (1, 2, nq, 4)) * 1e2   # scores of +-1e4 after the 1/sqrt(d) scale...
    k = rng.choice([-1.0, 1.0], (1, 2, nk, 4)) * 1e2   # ...so exp overflows unless the max is subtracted
    v = rng.standard_normal((1, 2, nk, 4))
    for causal in (False, True):
        check(q, k, v, 16, 16, causal)
    if nq > nk:  # bottom-right causal: the first nq - nk rows see nothing, output zero, L = -inf
        o, lse = tiled_attention(q, k, v, 16, 16, "flash2", causal=True)
        assert (o[:, :, : nq - nk] == 0).all() and np.isneginf(lse[:, :, : nq - nk]).all()
        assert not causal_mask(nq, nk)[: nq - nk].any()


def test_block_sizes_not_dividing_n_and_one_row():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((3, 1, 1, 1, 8))
    check(q, k, v, 128, 128, True)
    q = rng.standard_normal((1, 1, 1000, 8))
    k, v = rng.standard_normal((2, 1, 1, 333, 8))
    check(q, k, v, 128, 64, False)

"""The tiled backward in numpy (the CUDA kernels' blocks: P recomputed from the log-sum-exp, D = rowsum(dO * O),
dK and dV per key tile, dQ accumulated across key tiles) equals exact float64 gradients, and those equal finite
differences of the forward."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gpu_kernels.reference import reference_attention, reference_attention_backward, tiled_attention_backward


def grads_close(a, b, tol=1e-10):
    for x, y in zip(a, b):
        assert np.isfinite(x).all()
        assert np.allclose(x, y, rtol=tol, atol=tol)


def tiled_vs_exact(q, k, v, do, bq, bkv, causal):
    o, lse = reference_attention(q, k, v, causal)
    exact = reference_attention_backward(q, k, v, do, causal)
    for order in ("flash1", "flash2"):
        grads_close(tiled_attention_backward(q, k, v, o, lse, do, bq, bkv, order, causal), exact)
    return exact


@settings(max_examples=50, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.sampled_from([1, 2, 3]), nq=st.integers(1, 60),
       nk=st.integers(1, 60), d=st.sampled_from([1, 4, 16]), bq=st.sampled_from([1, 8, 16, 64]),
       bkv=st.sampled_from([1, 8, 16, 64]), causal=st.booleans(), seed=st.integers(0, 2**31))
def test_tiled_backward_equals_exact_on_random_inputs(b, hkv, g, nq, nk, d, bq, bkv, causal, seed):
    rng = np.random.default_rng(seed)
    q, do = rng.standard_normal((2, b, hkv * g, nq, d))
    k, v = rng.standard_normal((2, b, hkv, nk, d))
    tiled_vs_exact(q, k, v, do, bq, bkv, causal)


@pytest.mark.parametrize("nq, nk", [(1, 1), (37, 100), (100, 37), (65, 63)])
def test_large_logits_and_fully_masked_rows(nq, nk):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, nq, 8)) * 30     # scores in the hundreds: exp overflows unless L is subtracted
    k = rng.standard_normal((1, 1, nk, 8)) * 30
    v, do = rng.standard_normal((1, 1, nk, 8)), rng.standard_normal((1, 2, nq, 8))
    for causal in (False, True):
        dq, dk, dv = tiled_vs_exact(q, k, v, do, 16, 32, causal)
        if causal and nq > nk:   # query rows left of every key see nothing: no gradient from them or to them
            blind = nq - nk
            assert not dq[:, :, :blind].any()


def test_exact_gradients_equal_finite_differences():
    rng = np.random.default_rng(7)
    q, do = rng.standard_normal((2, 1, 4, 9, 5))
    k, v = rng.standard_normal((2, 1, 2, 11, 5))
    for causal in (False, True):
        dq, dk, dv = reference_attention_backward(q, k, v, do, causal)

        def loss(q, k, v):
            return (reference_attention(q, k, v, causal)[0] * do).sum()
        for x, dx, which in ((q, dq, 0), (k, dk, 1), (v, dv, 2)):
            for idx in [tuple(rng.integers(0, s) for s in x.shape) for _ in range(6)]:
                e = np.zeros_like(x)
                e[idx] = 1e-6
                args_p = [q, k, v]
                args_m = [q, k, v]
                args_p[which], args_m[which] = x + e, x - e
                fd = (loss(*args_p) - loss(*args_m)) / 2e-6
                assert abs(fd - dx[idx]) <= 1e-6 * max(1.0, abs(fd)), (which, idx, causal)

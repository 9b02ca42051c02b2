"""The CUDA kernels on a real GPU (marked gpu; skipped where there is no GPU, CuPy or torch).

Each check: fresh random inputs, the output poisoned with NaN before the run, compared with a float64
reference by ||out - ref|| / ||ref|| and with torch's scaled_dot_product_attention; NaN never passes.
"""
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from gpu_kernels import build  # noqa: E402
from gpu_kernels.ops import attention, flash_attention  # noqa: E402
from iosim.errors import IosimError  # noqa: E402
from iosim.plan import Tiling  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def compiled():
    build.precompile()   # every instance in one NVRTC pass
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(q, k, v, causal):
    """float64 attention on the GPU, bottom-right causal, fully masked rows zero."""
    q, k, v = (x.double() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    if causal:
        mask = torch.arange(nk, device=q.device)[None] <= torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    p = (s - m).exp()
    lsum = p.sum(-1, keepdim=True)
    o = (p @ v) / lsum.clamp_min(1e-300)
    lse = torch.where(lsum[..., 0] > 0, (m + lsum.clamp_min(1e-300).log())[..., 0], float("-inf"))
    return o, lse


def rel_err(out, ref):
    assert not torch.isnan(out).any(), "NaN in output"
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def inputs(b, h, hkv, nq, nk, d, dtype):
    q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype)
    return q, k, v


SHAPES = [  # b, h, hkv, nq, nk
    (2, 4, 4, 1024, 1024), (1, 4, 2, 1000, 1000), (2, 2, 2, 257, 513), (1, 2, 1, 513, 257), (1, 1, 1, 1, 1),
    (1, 2, 2, 77, 300),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_kernels_match_float64_for_every_built_tiling(dtype, d, causal):
    for shape in SHAPES:
        q, k, v = inputs(*shape, d, dtype)
        ref_o, ref_l = reference(q, k, v, causal)
        for bq, bkv, w, st in build.TILINGS[d]:
            for order in ("flash1", "flash2"):
                grids = [("q_fastest", "ascending"), ("bh_fastest", "ascending"), ("q_fastest", "descending"),
                         ("bh_fastest", "descending")] if order == "flash2" else [("q_fastest", "ascending")]
                for grid, q_order in grids:
                    t = Tiling(block_q=bq, block_kv=bkv, warps=w, stages=st, loop_order=order, grid_order=grid,
                               q_order=q_order)
                    out = torch.full_like(q, float("nan"))
                    o, lse = flash_attention(q, k, v, causal=causal, tiling=t, return_lse=True, out=out)
                    err = rel_err(o, ref_o)
                    assert err < TOL[dtype], (shape, t.describe(), err)
                    fin = torch.isfinite(ref_l)
                    assert torch.equal(torch.isfinite(lse), fin), (shape, t.describe())
                    assert (lse[fin].double() - ref_l[fin]).abs().max().item() < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_matches_float64(dtype, causal):
    for shape in SHAPES:
        for d in (64, 128):
            q, k, v = inputs(*shape, d, dtype)
            err = rel_err(attention(q, k, v, "naive", causal=causal), reference(q, k, v, causal)[0])
            assert err < TOL[dtype], (shape, d, err)


@pytest.mark.parametrize("algorithm", ["naive", "flash1", "flash2"])
def test_against_torch_sdpa(algorithm):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (False, True):
        q, k, v = inputs(2, 8, 8, 2048, 2048, 64, torch.float16)
        ref = sdpa(q, k, v, is_causal=causal)   # square: top-left and bottom-right agree
        err = rel_err(attention(q, k, v, algorithm, causal=causal), ref.double())
        assert err < 2e-3, (algorithm, causal, err)


def test_adversarial_logits_do_not_overflow():
    q, k, v = inputs(1, 2, 2, 300, 300, 64, torch.float16)
    q, k = q.sign() * 12, k.sign() * 12          # scores of about +-1e3 after scaling
    ref = reference(q, k, v, False)[0]
    for algorithm in ("naive", "flash1", "flash2"):
        assert rel_err(attention(q, k, v, algorithm), ref) < 5e-3


def test_cupy_arrays_in_and_out():
    import cupy as cp
    q, k, v = inputs(1, 2, 2, 256, 256, 64, torch.float16)
    out = attention(cp.from_dlpack(q), cp.from_dlpack(k), cp.from_dlpack(v), "flash2")
    assert isinstance(out, cp.ndarray)
    assert rel_err(torch.from_dlpack(out), reference(q, k, v, False)[0]) < 2e-3


def test_bad_inputs_are_refused_clearly():
    q, k, v = inputs(1, 2, 2, 64, 64, 64, torch.float16)
    with pytest.raises(IosimError, match="CPU tensor"):
        attention(q.cpu(), k, v)
    with pytest.raises(IosimError, match="not contiguous"):
        attention(q.transpose(2, 3), k, v)
    with pytest.raises(IosimError, match="float16 or bfloat16"):
        attention(q.float(), k.float(), v.float())
    with pytest.raises(IosimError, match="4-D"):
        attention(q[0], k[0], v[0])
    with pytest.raises(IosimError, match="no kernel built for tiling"):
        flash_attention(q, k, v, tiling=Tiling(block_q=32, block_kv=32))
    with pytest.raises(IosimError, match="multiple of kv_heads"):
        attention(q, k[:, :1].repeat(1, 3, 1, 1).contiguous(), v[:, :1].repeat(1, 3, 1, 1).contiguous())

"""flash3, the Hopper forward (gpu_kernels/hopper.cu), on a real sm_90 GPU (marked gpu; skipped elsewhere).

As for the other kernels: fresh random inputs, the output poisoned with NaN, ||out - ref|| / ||ref|| against a
float64 reference, and against torch's scaled_dot_product_attention; NaN never passes."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytest.importorskip("cuda.bindings")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("no Hopper (sm_90) GPU", allow_module_level=True)

from gpu_kernels.hopper import flash3_attention  # noqa: E402
from iosim.errors import IosimError  # noqa: E402
from test_gpu_kernels import SHAPES, TOL, inputs, reference, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pingpong", [True, False])
def test_flash3_matches_float64(dtype, d, causal, pingpong):
    for shape in SHAPES + [(1, 2, 2, 4096 + 3, 4096 + 3)]:
        q, k, v = inputs(*shape, d, dtype)
        ref_o, ref_l = reference(q, k, v, causal)
        out = torch.full_like(q, float("nan"))
        o, lse = flash3_attention(q, k, v, causal=causal, return_lse=True, out=out, pingpong=pingpong)
        err = rel_err(o, ref_o)
        assert err < TOL[dtype], (shape, err)
        fin = torch.isfinite(ref_l)
        assert torch.equal(torch.isfinite(lse), fin), shape
        assert (lse[fin].double() - ref_l[fin]).abs().max().item() < 1e-2


def test_flash3_error_is_no_worse_than_sdpa_flash():
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (False, True):
        for d in (64, 128):
            q, k, v = inputs(2, 8, 8, 2048, 2048, d, torch.float16)
            ref = reference(q, k, v, causal)[0]
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                theirs = rel_err(sdpa(q, k, v, is_causal=causal), ref)
            ours = rel_err(flash3_attention(q, k, v, causal=causal), ref)
            assert ours <= 2 * theirs + 1e-4, (causal, d, ours, theirs)


def test_flash3_large_logits_and_fully_masked_rows():
    q, k, v = inputs(1, 2, 2, 300, 300, 64, torch.float16)
    q, k = q.sign() * 12, k.sign() * 12
    assert rel_err(flash3_attention(q, k, v), reference(q, k, v, False)[0]) < 5e-3
    q, k, v = inputs(1, 2, 2, 513, 257, 128, torch.float16)   # causal, Nq > Nk: the first 256 rows see no key
    o, lse = flash3_attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(o[:, :, :256] == 0) and torch.all(torch.isneginf(lse[:, :, :256]))
    assert rel_err(o, reference(q, k, v, True)[0]) < TOL[torch.float16]


def test_flash3_refuses_what_it_has_no_kernel_for():
    q, k, v = inputs(1, 2, 2, 64, 64, 256, torch.float16)
    with pytest.raises(IosimError, match="head_dim 256 has no flash3 kernel"):
        flash3_attention(q, k, v)


@pytest.mark.parametrize("d", [64, 128])
def test_flash3_persistent_grid_gives_one_block_a_tiles_bits(d):
    # more work tiles than SMs, so each block of the persistent grid takes several in turn, its Q buffers and K/V ring
    # phases running on across them: GQA, odd N, Nq != Nk, and (causal, Nq > Nk) tiles that see no key at all
    for shape, causal in [((4, 16, 4, 1003, 1003), False), ((4, 16, 4, 1003, 1003), True),
                          ((8, 16, 4, 1031, 519), True), ((3, 12, 12, 777, 2049), False)]:
        q, k, v = inputs(*shape, d, torch.bfloat16)
        one, lse1 = flash3_attention(q, k, v, causal=causal, return_lse=True, out=torch.full_like(q, float("nan")),
                                     persistent=False)
        many, lse2 = flash3_attention(q, k, v, causal=causal, return_lse=True, out=torch.full_like(q, float("nan")))
        assert torch.equal(one, many) and torch.equal(lse1, lse2), (shape, causal)
        assert rel_err(many, reference(q, k, v, causal)[0]) < TOL[torch.bfloat16], (shape, causal)

"""Differentiable attention for torch: the forward saves what its backward needs (flash: O and the log-sum-exp;
naive: P), the backward runs the same algorithm's backward kernels (`backward`)."""
from __future__ import annotations

import torch

from .backward import flash_attention_backward, naive_attention_backward
from .ops import _flash, naive_attention


class Attention(torch.autograd.Function):
    """`Attention.apply(q, k, v, algorithm, causal, scale, tiling, bwd_tiling)`; use `gpu_kernels.ops.attention`."""

    @staticmethod
    def forward(ctx, q, k, v, algorithm, causal, scale, tiling, bwd_tiling):
        if algorithm == "naive":
            o, p = naive_attention(q, k, v, causal=causal, scale=scale, return_p=True)
            ctx.save_for_backward(q, k, v, p)
        else:
            o, lse = _flash(q, k, v, algorithm, causal, tiling, scale, True, None)
            ctx.save_for_backward(q, k, v, o, lse)
        ctx.algorithm, ctx.causal, ctx.scale, ctx.bwd_tiling = algorithm, causal, scale, bwd_tiling
        return o

    @staticmethod
    def backward(ctx, do):
        do = do.contiguous()   # a loss's gradient is often a broadcast view
        if ctx.algorithm == "naive":
            q, k, v, p = ctx.saved_tensors
            dq, dk, dv = naive_attention_backward(q, k, v, p, do, causal=ctx.causal, scale=ctx.scale)
        else:
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=ctx.causal, loop_order=ctx.algorithm,
                                                  tiling=ctx.bwd_tiling, scale=ctx.scale)
        return dq, dk, dv, None, None, None, None, None

"""The kernel catalogue: what runs on the chip for each algorithm, under one naming scheme.

- `builds`: our CUDA builds (gpu_kernels/attention.cu) as nvcc made them: registers, machine code, pipe cycles.
- `torch_fa2`: PyTorch's FlashAttention-2 forward: its tiling heuristic and its build.
- `cublas`: cuBLAS's GEMM tiles, clusters and epilogue, keyed by the chip's architecture.
- `catalogue.run_traits`: the traits each planned kernel runs with, fitted values joined to its build's facts.

Algorithms by name: `naive`, `flash1`, `flash2` (ours, planned and built); `torch_flash` (PyTorch's SDPA flash
backend, planned as flash2 with FlashAttention-2's tiling). Kernels by name: `naive_qk`, `naive_softmax`,
`naive_pv`, `flash1_fwd`, `flash2_fwd`, `flash2_fwd_split`, `flash2_combine`.
"""

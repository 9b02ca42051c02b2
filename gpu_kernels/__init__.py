"""Real CUDA kernels for the algorithms iosim models: naive attention and tiled attention (flash1, flash2), forward
(`ops`) and backward (`backward`), differentiable from torch (`autograd`, through `ops.attention`).

Importing this package needs only numpy; CuPy is imported by the launchers when they are first used, so the
numpy references and the kernel sources can be checked on a machine without a GPU.
"""

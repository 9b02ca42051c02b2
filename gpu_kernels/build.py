"""Which kernel instances exist, and compiling them: NVRTC through CuPy at run time, nvcc for the CPU check.

One list of template instances serves both, so what CI compiles with nvcc is what the GPU runs.
"""
from __future__ import annotations

from pathlib import Path

from iosim.plan.backward import split_layout

SOURCE = Path(__file__).with_name("attention.cu")
BACKWARD_SOURCE = Path(__file__).with_name("backward.cu")   # compiled after attention.cu, whose wrappers it uses
HOPPER_SOURCE = Path(__file__).with_name("hopper.cu")       # likewise; sm_90a only
HEAD_DIMS = (64, 128, 256)
# (block_q, block_kv, warps, stages) offered for each head_dim: FlashAttention-2's sizes and neighbours, and
# 8-warp versions of them (16 rows a warp: fewer registers, twice the K/V shared-memory reads per FLOP);
# block_q must be 16 * warps * (1 or 2)
TILINGS = {
    64: [(128, 128, 4, 2), (128, 64, 4, 2), (64, 64, 4, 2), (64, 128, 4, 2), (128, 128, 4, 1), (64, 64, 4, 1),
         (128, 128, 8, 2), (128, 64, 8, 2)],
    128: [(128, 64, 4, 2), (64, 64, 4, 2), (128, 32, 4, 2), (64, 128, 4, 2), (128, 64, 4, 1), (64, 64, 4, 1),
          (128, 64, 8, 2), (128, 128, 8, 2)],
    256: [(64, 64, 4, 2), (64, 32, 4, 2), (64, 64, 4, 1)],
}
SOFTMAX_THREADS = 256
# the backward's (block_q, block_kv, warps) for each head_dim; block_kv = 16 * warps (a warp owns 16 keys); the
# first is the default (`iosim.plan.Tiling.backward`). Query rows go through in chunks of QUERY_CHUNK[d] (the
# chunk's S and dP live in registers beside the warp's dK and dV)
BWD_TILINGS = {64: [(128, 128, 8), (64, 128, 8), (64, 64, 4)], 128: [(64, 128, 8), (64, 64, 4)]}
QUERY_CHUNK = {64: 64, 128: 64}
ROW_THREADS = 256   # bwd_dot's and softmax_bwd_rows' block
# softmax_bwd_rows keeps 4 bytes a key in shared memory, plus up to two 16-byte vectors a tensor that a row
# starting off a 16-byte boundary shares with its neighbours
SOFTMAX_BWD_SMEM_PAD = 64


def flash_name(loop_order: str, d: int, bq: int, bkv: int, warps: int, stages: int, bf16: bool) -> str:
    return f"{loop_order}_fwd<{d},{bq},{bkv},{warps},{stages},{'true' if bf16 else 'false'}>"


def softmax_name(bf16: bool) -> str:
    return f"softmax_rows<{SOFTMAX_THREADS},{'true' if bf16 else 'false'}>"


def bwd_name(loop_order: str, d: int, bq: int, bkv: int, warps: int, bf16: bool) -> str:
    """The backward main kernel's instance; flash2's FlashAttention-2 warp layout (`flash2_bwd_split`: P^T and dS^T
    through shared memory) where `iosim.plan.backward.SPLIT_LAYOUT` runs it."""
    if split_layout(loop_order, d, bq, bkv):
        return split_name(d, bq, warps, bf16)
    return f"{loop_order}_bwd<{d},{bq},{QUERY_CHUNK[d]},{warps},{'true' if bf16 else 'false'}>"


def split_name(d: int, bq: int, warps: int, bf16: bool) -> str:
    return f"flash2_bwd_split<{d},{bq},{warps},{'true' if bf16 else 'false'}>"


def dot_name(d: int, bf16: bool) -> str:
    return f"bwd_dot<{d},{ROW_THREADS},{'true' if bf16 else 'false'}>"


def convert_name(bf16: bool) -> str:
    return f"bwd_convert<{'true' if bf16 else 'false'}>"


def softmax_bwd_name(bf16: bool) -> str:
    return f"softmax_bwd_rows<{ROW_THREADS},{'true' if bf16 else 'false'}>"


def backward_names() -> list[str]:
    names = []
    for bf in (False, True):
        names += [convert_name(bf), softmax_bwd_name(bf)] + [dot_name(d, bf) for d in HEAD_DIMS]
        for d, tilings in BWD_TILINGS.items():
            for bq, bkv, w in tilings:
                names += [bwd_name(order, d, bq, bkv, w, bf) for order in ("flash1", "flash2")]
        names += [split_name(d, 64, 8, bf) for d in (64, 128) if split_name(d, 64, 8, bf) not in names]
    return names


def all_names() -> list[str]:
    """The forward's instances (`forward_names`) and the backward's."""
    return forward_names() + backward_names()


def sample_names() -> list[str]:
    """A few instances of every kernel: each kind's first at each head dim in fp16 and its first in bf16, the small
    kernels all, and flash2's d 64 64x64 tile (the quick compile check; `all_names` is the exhaustive one)."""
    seen, out = set(), []
    for n in all_names():
        kind, params = n.split("<")
        args = params.rstrip(">").split(",")
        key = (kind, args[0], args[-1]) if args[-1] == "false" else (kind, args[-1])
        if key not in seen or not kind.startswith("flash") or n == flash_name("flash2", 64, 64, 64, 4, 2, False):
            seen.add(key)
            out.append(n)
    return out


def forward_names() -> list[str]:
    names = [softmax_name(bf) for bf in (False, True)]
    for d, tilings in TILINGS.items():
        for bq, bkv, w, st in tilings:
            for order in ("flash1", "flash2"):
                for bf in (False, True):
                    names.append(flash_name(order, d, bq, bkv, w, st, bf))
    return names


def flash3_name(d: int, bkv: int, stages: int, consumers: int, pingpong: bool, bf16: bool) -> str:
    return (f"flash3_fwd<{d},{bkv},{stages},{consumers},{'true' if pingpong else 'false'},"
            f"{'true' if bf16 else 'false'}>")


def flash3_names() -> list[str]:
    """Every instance launched at iosim.plan.flash3's geometries per head_dim, ping-pong on and off, fp16 and bf16."""
    from iosim.plan.flash3 import GEOMETRIES, STAGES
    from .hopper import HEAD_DIMS
    return [flash3_name(d, bkv, STAGES, cons, pp, bf) for d in HEAD_DIMS for cons, bkv in GEOMETRIES[d]
            for pp in (True, False) for bf in (False, True)]


def wgmma_asm(n: int, bf16: bool, a_operand: str, first: int, scale_d: str) -> tuple[str, str]:
    """One `wgmma.mma_async` m64n{n}k16 with fp32 accumulators, as an inline-asm template and its accumulator
    operands (`d[0]` ... as "+f"): written out by code because the instruction names every accumulator register.
    a_operand: the A operand's text ("%k" for a descriptor, "{%k,...}" for registers); first: the operand number
    after the accumulators' (the B descriptor's when A is one); scale_d: 1 or a predicate's name."""
    acc, ty = n // 2, "bf16" if bf16 else "f16"
    regs = ",".join(f"%{i}" for i in range(acc))
    ops = ",".join(f'"+f"(d[{i}])' for i in range(acc))
    tail = "1, 1, 1" if a_operand.startswith("{") else "1, 1, 0, 0"
    return (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, {a_operand}, %{first}, {scale_d}, "
            f"{tail};", ops)


def wgmma_wrappers() -> str:
    """hopper.cu's wgmma_ss (A and B from shared memory, D overwritten or accumulated as `acc` says) and wgmma_rs
    (A from registers, D accumulated) for N 64, 128 and 192, fp16 and bf16."""
    out = []
    for n in (64, 128, 192):
        acc = n // 2
        for bf16 in (False, True):
            flag = "true" if bf16 else "false"
            instr, ops = wgmma_asm(n, bf16, f"%{acc}", acc + 1, "p")
            out.append(f"template <> DEVI void wgmma_ss<{n}, {flag}>(float* d, u64 da, u64 db, int acc) {{\n"
                       f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{acc + 2}, 0;\\n{instr}\\n}}\\n"\n'
                       f'                 : {ops}\n                 : "l"(da), "l"(db), "r"(acc));\n}}\n')
            instr, ops = wgmma_asm(n, bf16, "{" + ",".join(f"%{acc + i}" for i in range(4)) + "}", acc + 4, "p")
            out.append(f"template <> DEVI void wgmma_rs<{n}, {flag}>(float* d, const u32* a, u64 db) {{\n"
                       f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{acc + 5}, 0;\\n{instr}\\n}}\\n"\n'
                       f'                 : {ops}\n                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), '
                       f'"l"(db), "r"(1));\n}}\n')
    return "".join(out)


def hopper_source(names: list[str] | None = None) -> str:
    """attention.cu and hopper.cu; with `names`, every instance spelled out for `nvcc -arch=sm_90a -c`."""
    hopper = HOPPER_SOURCE.read_text()
    i = hopper.find("// WGMMA_WRAPPERS:")   # absent from a hopper.cu of before (experiments' variants): written out
    src = SOURCE.read_text() + "\n" + (hopper if i < 0 else hopper[:i] + wgmma_wrappers() + hopper[i:])
    if names is None:
        return src
    sig = "(const u64*, u16*, float*, int, int, int, int, int, float, int, int, u32, u32, int*)"
    return src + "\n" + "\n".join(f"template __global__ void {n}{sig};" for n in names) + "\n"


def source() -> str:
    return SOURCE.read_text() + "\n" + BACKWARD_SOURCE.read_text()


def nvcc_source(names: list[str] | None = None) -> str:
    """The source with every instance (or those of `names`) spelled out, for `nvcc -c` (templates alone would not
    be checked)."""
    lines = [source(), "", "// explicit instances (generated by gpu_kernels.build)"]
    flash_args = ("(const u16*, const u16*, const u16*, u16*, float*, int, int, int, int, int, float, int, int, "
                  "int)")
    flash1_args = ("(const u16*, const u16*, const u16*, u16*, float*, float*, float*, float*, int, int, int, "
                   "int, int, float, int)")
    args = {"flash2_bwd": "(const u16*, const u16*, const u16*, const u16*, const float*, const float*, float*, u16*, "
                          "u16*, int, int, int, int, int, float, float, int)",
            "flash1_bwd": "(const u16*, const u16*, const u16*, const u16*, const u16*, const float*, float*, u16*, "
                          "u16*, int, int, int, int, float, float, int)",
            "bwd_dot": "(const u16*, const u16*, float*, float*, long long)",
            "bwd_convert": "(const float*, u16*, long long, float)",
            "softmax_bwd_rows": "(const u16*, const u16*, u16*, int, float)",
            "softmax_rows": "(const u16*, u16*, int, int, float, int)"}
    args["flash2_bwd_split"] = args["flash2_bwd"]   # the FlashAttention-2 warp layout takes the same arguments
    for n in all_names() if names is None else names:
        kind = n.split("<")[0]
        if kind in args:
            lines.append(f"template __global__ void {n}{args[kind]};")
        else:  # the forward's flash instances
            lines.append(f"template __global__ void {n}{flash1_args if n.startswith('flash1') else flash_args};")
    return "\n".join(lines) + "\n"


_modules: dict[str, object] = {}
_defines: tuple[str, ...] = ()   # extra -D options: the block trace's, set by `trace`


def trace(max_blocks: int) -> None:
    """Compile from now on with the block trace (attention.cu's IOSIM_TRACE) for the first `max_blocks` blocks of
    a grid, or without it (0). For experiments/block_placement/block_trace.py; forgets the instances compiled before."""
    global _defines
    _defines = (f"-DIOSIM_TRACE={max_blocks}",) if max_blocks > 0 else ()
    _modules.clear()


def trace_buffer(name: str):
    """The block trace of instance `name`'s last launch: a CuPy array of (SM, start ns, end ns, SM clocks, first
    key tile loaded ns, last step done ns) rows (the last two flash2's only, 0 for flash1)."""
    if not _defines:
        raise RuntimeError("the kernels were built without the block trace: call build.trace(n) first")
    import cupy as cp
    n = int(_defines[0].split("=")[1])
    return cp.ndarray((n, 6), dtype=cp.uint64, memptr=_modules[name].get_global("iosim_trace"))


def _compile(names: list[str]):
    import cupy as cp
    cc = cp.cuda.Device().compute_capability
    smem_per_sm = cp.cuda.Device().attributes["MaxSharedMemoryPerMultiprocessor"]  # for the occupancy hint
    mod = cp.RawModule(code=source(),
                       options=("-std=c++17", f"-arch=sm_{cc}", f"-DSMEM_PER_SM={smem_per_sm}", *_defines),
                       name_expressions=names)
    mod.compile()
    for n in names:
        _modules[n] = mod
    return mod


def precompile(names: list[str] | None = None) -> None:
    """Compile many instances in one NVRTC pass (all by default): one pass costs about what a single one does."""
    todo = [n for n in (names or all_names()) if n not in _modules]
    if todo:
        _compile(todo)


def kernel(name: str):
    """The compiled kernel instance `name`, compiling it on first use."""
    mod = _modules.get(name) or _compile([name])
    return mod.get_function(name)

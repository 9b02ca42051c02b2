// Tiled attention forward passes (flash2: FlashAttention-2's order; flash1: the paper's Algorithm 1) and the
// naive softmax, for fp16 and bf16 with fp32 accumulation on tensor cores.
//
// Building blocks, each the PTX FlashAttention-2 uses: cp.async (global -> shared, 16 bytes, zero-filled past the
// end), ldmatrix (shared -> mma fragments; .trans for V), mma.sync.m16n8k16 (fp32 accumulate). Shared-memory
// tiles are [rows][D] with 16-byte chunks XOR-swizzled by row (chunk ^ row % 8), so ldmatrix and cp.async are
// free of bank conflicts without padding: a tile takes exactly rows * D * 2 bytes, as iosim's Tiling counts.
// No headers: 16-bit values are moved as raw bits and converted with PTX, so NVRTC needs nothing extra.
//
// Each warp owns 16 * MT query rows. Per K/V tile: S = Q K^T (fp32, registers), mask (sequence end, causal),
// online softmax in base 2 (running max m, sum l), O += P V with P reused from S's registers as the A operand.

typedef unsigned short u16;
typedef unsigned int u32;

#ifndef INFINITY  // NVRTC has no math headers
#define INFINITY __int_as_float(0x7f800000)
#endif

#define DEVI __device__ __forceinline__
#ifndef SMEM_PER_SM  // bytes of shared memory an SM gives its blocks (H100/H200: 228 KiB); build.py passes the GPU's
#define SMEM_PER_SM 233472
#endif

// ---- block trace (experiments/block_placement/block_trace.py builds with -DIOSIM_TRACE=<blocks>; the kernels run here are
// built without it): per block its SM, start and end on the global timer (ns) and its SM clocks, written by thread
// 0 after the block's last store is issued, to compare with the engine's timeline; flash2 also marks when its first
// key tile is in shared memory and when its last step is done (its prologue and epilogue; 0 for flash1)
#ifdef IOSIM_TRACE
#define TRACE_ROW 6
__device__ unsigned long long iosim_trace[TRACE_ROW * IOSIM_TRACE];
DEVI unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
DEVI unsigned sm_id() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
#define TRACE_BEGIN \
    const unsigned long long trace_ns0 = global_ns(), trace_clk0 = clock64(); \
    unsigned long long trace_loaded = 0, trace_steps_done = 0;
#define TRACE_LOADED(j) if ((j) == 0) trace_loaded = global_ns();
#define TRACE_STEPS_DONE trace_steps_done = global_ns();
#define TRACE_END                                                                                   \
    __syncthreads();                                                                                \
    if (threadIdx.x == 0 && blockIdx.x < IOSIM_TRACE) {                                             \
        unsigned long long* tr = iosim_trace + TRACE_ROW * blockIdx.x;                              \
        tr[0] = sm_id(), tr[1] = trace_ns0, tr[2] = global_ns(), tr[3] = clock64() - trace_clk0;    \
        tr[4] = trace_loaded, tr[5] = trace_steps_done;                                             \
    }
#else
#define TRACE_BEGIN
#define TRACE_LOADED(j)
#define TRACE_STEPS_DONE
#define TRACE_END
#endif

// ---- PTX wrappers -----------------------------------------------------------------------------------------

DEVI u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

DEVI void cp_async16(void* dst, const void* src, bool valid) {
    // src-size 0 fills the 16 bytes with zeros: rows past the end of Q, K or V read as zero
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
DEVI void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> DEVI void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

DEVI void ldmatrix_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
DEVI void ldmatrix_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

template <bool BF16> DEVI void mma16816(float* c, const u32* a, const u32* b);
template <> DEVI void mma16816<false>(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> DEVI void mma16816<true>(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// two floats -> one register of two 16-bit values, lo in the low half
template <bool BF16> DEVI u32 pack2(float lo, float hi);
template <> DEVI u32 pack2<false>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> DEVI u32 pack2<true>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <bool BF16> DEVI float to_float(u16 x);
template <> DEVI float to_float<false>(u16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
    return f;
}
template <> DEVI float to_float<true>(u16 x) { return __uint_as_float(((u32)x) << 16); }
template <bool BF16> DEVI u16 from_float(float f) { return (u16)(pack2<BF16>(f, 0.f) & 0xffffu); }

DEVI float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- shared-memory tiles ------------------------------------------------------------------------------------

// element offset of (row, 16-byte chunk) in a swizzled [rows][D] tile
template <int D> DEVI int swz(int row, int chunk) { return row * D + ((chunk ^ (row & 7)) << 3); }

// Shared byte address of (row, chunk 2k + c) in a swizzled tile whose base is a multiple of 2D bytes, for a
// row with row % 8 == x: base + row * 2D + ((2k + c) ^ x) * 16 == (base + row * 2D + (c ^ x) * 16) ^ (k * 32),
// since 2k + c == 2k ^ c and the row's part has no bits below 2D. So a thread keeps one address per operand
// and each fragment costs one XOR; further rows are added as immediates.
template <int D> DEVI u32 frag_base(const u16* tile, int row, int c) {
    return smem_addr(tile) + row * 2 * D + ((c ^ (row & 7)) << 4);
}

// rows [row0, row0 + ROWS) of a [n][D] matrix into a swizzled tile; rows >= n are zero-filled. Each thread
// copies one 16-byte column chunk of every PASS-th row, so its addresses are one base plus constant strides
// (no per-copy address registers live across the main loop).
template <int ROWS, int D, int THREADS>
DEVI void load_tile(u16* tile, const u16* g, int row0, int n) {
    constexpr int CHUNKS = D / 8, PASS = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0 && ROWS % PASS == 0, "tile rows must split evenly over the threads");
    const int r = threadIdx.x / CHUNKS, ch = threadIdx.x % CHUNKS;
    const u16* src = g + (size_t)(row0 + r) * D + ch * 8;
#pragma unroll
    for (int i = 0; i < ROWS / PASS; ++i) {
        const bool valid = row0 + r + i * PASS < n;
        // PASS % 8 == 0 keeps the swizzle of (r + i * PASS) equal to r's, a constant offset from the first copy
        u16* dst = PASS % 8 == 0 ? tile + swz<D>(r, ch) + i * PASS * D : tile + swz<D>(r + i * PASS, ch);
        cp_async16(dst, valid ? src + (size_t)i * PASS * D : g, valid);
    }
}

// ---- one warp's share of one (query tile, key tile) step ----------------------------------------------------

template <int D, int BC, int MT, bool BF16>
struct WarpState {
    float o[MT][D / 8][4];  // output accumulator, mma C layout
    float m[MT][2];         // running max (base 2, scale folded in) of rows g and g + 8
    float l[MT][2];         // running sum: this thread's part (see row_sum)

    DEVI float row_sum(int mt, int hf) const {  // the whole row's sum: add the parts of the row's 4 threads
        float x = l[mt][hf];
        x += __shfl_xor_sync(0xffffffff, x, 1);
        return x + __shfl_xor_sync(0xffffffff, x, 2);
    }

    DEVI void init() {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
            m[mt][0] = m[mt][1] = -INFINITY;
            l[mt][0] = l[mt][1] = 0.f;
        }
    }

    // sQ: the block's query tile; warp_row: first row of this warp in it; q_row0: its global row;
    // sK, sV: this key tile; k_col0: its first key. Keys >= nk and, when causal, keys > row + off are masked.
    DEVI void step(const u16* sQ, int warp_row, int q_row0, const u16* sK, const u16* sV, int k_col0, int nk,
                   int off, bool causal, float scale_log2) {
        // only a tile crossing the sequence end or this warp's diagonal needs the mask: interior tiles take a
        // copy of the step without it (fewer live registers, no per-score compares)
        if ((k_col0 + BC > nk) || (causal && k_col0 + BC - 1 > q_row0 + warp_row + off))
            step_<true>(sQ, warp_row, q_row0, sK, sV, k_col0, nk, off, causal, scale_log2);
        else
            step_<false>(sQ, warp_row, q_row0, sK, sV, k_col0, nk, off, causal, scale_log2);
    }

    template <bool EDGE>
    DEVI void step_(const u16* sQ, int warp_row, int q_row0, const u16* sK, const u16* sV, int k_col0, int nk,
                    int off, bool causal, float scale_log2) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        // fragment rows of this lane (every 16-row step keeps row % 8) and its column-chunk bit
        const u32 q_base = frag_base<D>(sQ, warp_row + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 k_base = frag_base<D>(sK, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        const u32 v_base = frag_base<D>(sV, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        float s[MT][BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
        // S = Q K^T, k-steps of 16 over D
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], (q_base ^ (k << 5)) + mt * 16 * 2 * D);
#pragma unroll
            for (int n = 0; n < BC / 16; ++n) {
                u32 b[4];  // keys n*16 .. +15, d k*16 .. +15: b[0..1] for keys +0..7, b[2..3] for +8..15
                ldmatrix_x4(b, (k_base ^ (k << 5)) + n * 16 * 2 * D);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<BF16>(s[mt][2 * n], a[mt], b);
                    mma16816<BF16>(s[mt][2 * n + 1], a[mt], b + 2);
                }
            }
        }
        // mask, online softmax, and P into A fragments
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = q_row0 + warp_row + mt * 16 + g + hf * 8;
                float mx = -INFINITY;  // of the raw scores: the scale (> 0) is applied once, to the max
#pragma unroll
                for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        if (EDGE) {
                            int col = k_col0 + n * 8 + 2 * t + e;
                            if (col >= nk || (causal && col > row + off)) s[mt][n][2 * hf + e] = -INFINITY;
                        }
                        mx = fmaxf(mx, s[mt][n][2 * hf + e]);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                const float m_new = fmaxf(m[mt][hf], mx * scale_log2);
                const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: keep exp2 finite
                const float corr = fast_exp2(m[mt][hf] - m_use);
                float sum = 0.f;  // this thread's part of the row; the 4 parts are added once, at the end
#pragma unroll
                for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float p = fast_exp2(fmaf(s[mt][n][2 * hf + e], scale_log2, -m_use));  // one FFMA + EX2
                        s[mt][n][2 * hf + e] = p;
                        sum += p;
                    }
                l[mt][hf] = l[mt][hf] * corr + sum;
                m[mt][hf] = m_new;
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    o[mt][n][2 * hf] *= corr;
                    o[mt][n][2 * hf + 1] *= corr;
                }
            }
        }
        // O += P V: P's C fragments of two adjacent key n-tiles form one A fragment (k = 16 keys)
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = pack2<BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack2<BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack2<BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack2<BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int n = 0; n < D / 16; ++n) {
                u32 b[4];  // keys kk*16 .. +15, d n*16 .. +15, transposed: b[0..1] for d +0..7, b[2..3] for +8..15
                ldmatrix_x4_trans(b, (v_base ^ (n << 5)) + kk * 16 * 2 * D);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<BF16>(o[mt][2 * n], a[mt], b);
                    mma16816<BF16>(o[mt][2 * n + 1], a[mt], b + 2);
                }
            }
        }
    }

    // normalised O (rows < nq) in the input dtype, and L = log-sum-exp (natural log; -inf for a row that saw
    // no key, whose O is zero)
    DEVI void store_output(u16* O, float* L, int row0, int nq) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = row0 + mt * 16 + g + hf * 8;
                const float lsum = row_sum(mt, hf);  // every lane takes part in the shuffle
                if (row >= nq) continue;
                const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *(u32*)(O + (size_t)row * D + n * 8 + 2 * t) =
                        pack2<BF16>(o[mt][n][2 * hf] * inv, o[mt][n][2 * hf + 1] * inv);
                if (t == 0)
                    L[row] = lsum > 0.f ? (m[mt][hf] + __log2f(lsum)) * 0.6931471805599453f : -INFINITY;
            }
    }

    // flash1 keeps O unnormalised in fp32 between steps, with m and l
    DEVI void save(float* Oacc, float* M, float* Lsum, int row0, int nq) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = row0 + mt * 16 + g + hf * 8;
                const float lsum = row_sum(mt, hf);
                if (row >= nq) continue;
#pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *(float2*)(Oacc + (size_t)row * D + n * 8 + 2 * t) = make_float2(o[mt][n][2 * hf], o[mt][n][2 * hf + 1]);
                if (t == 0) {
                    M[row] = m[mt][hf];
                    Lsum[row] = lsum;
                }
            }
    }

    DEVI void restore(const float* Oacc, const float* M, const float* Lsum, int row0, int nq) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = row0 + mt * 16 + g + hf * 8;
                if (row >= nq) continue;  // rows past the end stay as init() left them
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    float2 v = *(const float2*)(Oacc + (size_t)row * D + n * 8 + 2 * t);
                    o[mt][n][2 * hf] = v.x;
                    o[mt][n][2 * hf + 1] = v.y;
                }
                m[mt][hf] = M[row];
                l[mt][hf] = t == 0 ? Lsum[row] : 0.f;  // the whole sum goes back as lane t == 0's part
            }
    }
};

// key tiles query block qb visits: all, or those left of its last row's diagonal
DEVI int visible_tiles(int qb, int BR, int BC, int nq, int nk, bool causal) {
    if (!causal) return (nk + BC - 1) / BC;
    int last = min(nq, (qb + 1) * BR) - 1;
    int keys = max(0, min(nk, last + (nk - nq) + 1));
    return (keys + BC - 1) / BC;
}

// Blocks per SM promised to the register allocator (__launch_bounds__): as many as shared memory allows and as
// the accumulators (O and S: 4 * MT * (D + BC) / 8 floats a thread) plus ~60 registers of addresses and softmax
// state leave room for. Promising more makes ptxas spill; promising fewer lets ptxas take ~230 registers where
// 64-row tiles need ~130-170, and the SM holds two blocks instead of three or four.
template <int D, int BR, int BC, int WARPS, int STAGES>
constexpr int min_blocks() {
    constexpr int MT = BR / (16 * WARPS), regs = 4 * MT * (D + BC) / 8 + 60;
    constexpr int by_regs = 65536 / (WARPS * 32 * regs);
    constexpr int by_smem = SMEM_PER_SM / ((BR + STAGES * 2 * BC) * D * 2 + 1024);
    constexpr int n = by_regs < by_smem ? by_regs : by_smem;
    return n < 1 ? 1 : n;
}

// ---- flash2: one block per (batch, head, query block) -------------------------------------------------------

template <int D, int BR, int BC, int WARPS, int STAGES, bool BF16>
__global__ void __launch_bounds__(WARPS * 32, (min_blocks<D, BR, BC, WARPS, STAGES>())) flash2_fwd(const u16* __restrict__ Q, const u16* __restrict__ K,
                                                         const u16* __restrict__ V, u16* __restrict__ O,
                                                         float* __restrict__ L, int B, int H, int HKV, int NQ,
                                                         int NK, float scale_log2, int causal, int bh_fastest,
                                                         int q_descending) {
    constexpr int MT = BR / (16 * WARPS), THREADS = WARPS * 32;
    static_assert(MT >= 1 && MT * 16 * WARPS == BR, "block_q must be 16 * warps * a whole number");
    static_assert(BC % 16 == 0 && D % 64 == 0, "block_kv a multiple of 16; head_dim a multiple of 64");
    TRACE_BEGIN
    extern __shared__ __align__(1024) unsigned char smem_bytes[];
    u16* sQ = (u16*)smem_bytes;
    u16* sK = sQ + BR * D;
    u16* sV = sK + STAGES * BC * D;

    const int nqb = (NQ + BR - 1) / BR;
    const int qi = bh_fastest ? blockIdx.x / (B * H) : blockIdx.x % nqb;
    const int qb = q_descending ? nqb - 1 - qi : qi;  // descending: a causal head's longest blocks first
    const int bh = bh_fastest ? blockIdx.x % (B * H) : blockIdx.x / nqb;
    const int b = bh / H, h = bh % H, kvh = h / (H / HKV);
    const u16* q = Q + (size_t)bh * NQ * D;
    const u16* k = K + (size_t)(b * HKV + kvh) * NK * D;
    const u16* v = V + (size_t)(b * HKV + kvh) * NK * D;
    const int q0 = qb * BR, warp_row = (threadIdx.x >> 5) * MT * 16, off = NK - NQ;
    const int nt = visible_tiles(qb, BR, BC, NQ, NK, causal);

    WarpState<D, BC, MT, BF16> st;
    st.init();
    if (nt > 0) load_tile<BR, D, THREADS>(sQ, q, q0, NQ);  // a block that sees no key reads nothing
    cp_async_commit();
    if (nt > 0) {
        load_tile<BC, D, THREADS>(sK, k, 0, NK);
        load_tile<BC, D, THREADS>(sV, v, 0, NK);
    }
    cp_async_commit();
    for (int j = 0; j < nt; ++j) {
        const int buf = STAGES > 1 ? j % STAGES : 0;
        if (STAGES > 1 && j + 1 < nt) {  // prefetch the next tile while this one is used
            const int nb = (j + 1) % STAGES;
            load_tile<BC, D, THREADS>(sK + nb * BC * D, k, (j + 1) * BC, NK);
            load_tile<BC, D, THREADS>(sV + nb * BC * D, v, (j + 1) * BC, NK);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        TRACE_LOADED(j)
        st.step(sQ, warp_row, q0, sK + buf * BC * D, sV + buf * BC * D, j * BC, NK, off, causal, scale_log2);
        __syncthreads();  // every warp is done with this buffer before it is refilled
        if (STAGES == 1 && j + 1 < nt) {
            load_tile<BC, D, THREADS>(sK, k, (j + 1) * BC, NK);
            load_tile<BC, D, THREADS>(sV, v, (j + 1) * BC, NK);
            cp_async_commit();
        }
    }
    TRACE_STEPS_DONE
    st.store_output(O + (size_t)bh * NQ * D, L + (size_t)bh * NQ, q0 + warp_row, NQ);
    TRACE_END
}

// ---- flash1: one block per (batch, head); outer loop over key tiles, inner over query blocks ---------------

template <int D, int BR, int BC, int WARPS, int STAGES, bool BF16>
__global__ void __launch_bounds__(WARPS * 32) flash1_fwd(const u16* __restrict__ Q, const u16* __restrict__ K,
                                                         const u16* __restrict__ V, u16* __restrict__ O,
                                                         float* __restrict__ L, float* __restrict__ Oacc,
                                                         float* __restrict__ Mrow, float* __restrict__ Lrow, int B,
                                                         int H, int HKV, int NQ, int NK, float scale_log2,
                                                         int causal) {
    constexpr int MT = BR / (16 * WARPS), THREADS = WARPS * 32;
    static_assert(MT >= 1 && MT * 16 * WARPS == BR, "block_q must be 16 * warps * a whole number");
    static_assert(BC % 16 == 0 && D % 64 == 0, "block_kv a multiple of 16; head_dim a multiple of 64");
    TRACE_BEGIN
    extern __shared__ __align__(1024) unsigned char smem_bytes[];
    u16* sQ = (u16*)smem_bytes;           // STAGES query tiles
    u16* sK = sQ + STAGES * BR * D;
    u16* sV = sK + BC * D;

    const int bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / HKV);
    const u16* q = Q + (size_t)bh * NQ * D;
    const u16* k = K + (size_t)(b * HKV + kvh) * NK * D;
    const u16* v = V + (size_t)(b * HKV + kvh) * NK * D;
    u16* o = O + (size_t)bh * NQ * D;
    float* lse = L + (size_t)bh * NQ;
    float* oacc = Oacc + (size_t)bh * NQ * D;
    float* mrow = Mrow + (size_t)bh * NQ;
    float* lrow = Lrow + (size_t)bh * NQ;
    const int nqb = (NQ + BR - 1) / BR, warp_row = (threadIdx.x >> 5) * MT * 16, off = NK - NQ;
    const int n_outer = visible_tiles(nqb - 1, BR, BC, NQ, NK, causal);

    for (int j = 0; j < n_outer; ++j) {
        load_tile<BC, D, THREADS>(sK, k, j * BC, NK);
        load_tile<BC, D, THREADS>(sV, v, j * BC, NK);
        cp_async_commit();
        // the query blocks that see tile j: a contiguous range ending at the last block
        int first = 0;
        while (first < nqb && visible_tiles(first, BR, BC, NQ, NK, causal) <= j) ++first;
        if (first < nqb) {
            load_tile<BR, D, THREADS>(sQ, q, first * BR, NQ);
            cp_async_commit();
        }
        for (int i = first; i < nqb; ++i) {
            const int buf = STAGES > 1 ? (i - first) % STAGES : 0;
            if (STAGES > 1 && i + 1 < nqb) {
                load_tile<BR, D, THREADS>(sQ + ((i + 1 - first) % STAGES) * BR * D, q, (i + 1) * BR, NQ);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            WarpState<D, BC, MT, BF16> st;
            st.init();
            const int r0 = i * BR + warp_row;
            if (j > 0) st.restore(oacc, mrow, lrow, r0, NQ);
            st.step(sQ + buf * BR * D, warp_row, i * BR, sK, sV, j * BC, NK, off, causal, scale_log2);
            if (j == visible_tiles(i, BR, BC, NQ, NK, causal) - 1)
                st.store_output(o, lse, r0, NQ);
            else
                st.save(oacc, mrow, lrow, r0, NQ);
            __syncthreads();
            if (STAGES == 1 && i + 1 < nqb) {
                load_tile<BR, D, THREADS>(sQ, q, (i + 1) * BR, NQ);
                cp_async_commit();
            }
        }
    }
    // query blocks that see no key at all: zero output, L = -inf
    for (int i = 0; i < nqb && visible_tiles(i, BR, BC, NQ, NK, causal) == 0; ++i) {
        WarpState<D, BC, MT, BF16> st;
        st.init();
        st.store_output(o, lse, i * BR + warp_row, NQ);
    }
    TRACE_END
}

// ---- naive attention's softmax: P = softmax(scale * S) row by row, masked rows zero -------------------------
// One block per row. The row is read from HBM once into shared memory (as fp32), reduced there, and P written
// once: the paper's one read and one write of S and P.

template <int THREADS, bool BF16>
__global__ void __launch_bounds__(THREADS) softmax_rows(const u16* __restrict__ S, u16* __restrict__ P, int NQ,
                                                        int NK, float scale_log2, int causal) {
    extern __shared__ float row[];
    __shared__ float red[THREADS / 32];
    const size_t r = blockIdx.x;
    const int qrow = (int)(r % NQ);
    const int keys = causal ? max(0, min(NK, qrow + (NK - NQ) + 1)) : NK;  // keys this row sees
    const u16* s = S + r * NK;
    u16* p = P + r * NK;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < NK; c += THREADS) {  // every column visited; masked ones' loads predicated off
        float v = c < keys ? to_float<BF16>(s[c]) * scale_log2 : -INFINITY;
        row[c] = v;
        mx = fmaxf(mx, v);
    }
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < THREADS / 32; ++w) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0.f;
    for (int c = threadIdx.x; c < keys; c += THREADS) {  // masked scores are written as zero without an exp
        float e = fast_exp2(row[c] - mx);
        row[c] = e;
        sum += e;
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) sum += red[w];
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int c = threadIdx.x; c < NK; c += THREADS) p[c] = from_float<BF16>(c < keys ? row[c] * inv : 0.f);
}

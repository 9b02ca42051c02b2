// flash3: a Hopper (sm_90a) forward pass in FlashAttention-3's design, compiled after attention.cu (whose
// helpers it uses) with -arch=sm_90a.
//
// One block per (batch, head, 64 x CONS query rows) of 128 x (CONS + 1) threads: a producer warpgroup and CONS
// consumers (iosim.plan.flash3.geometry picks CONS and the key tile BC per head_dim):
// - the producer (warpgroup 0) gives its registers away (setmaxnreg) and one of its threads issues TMA copies:
//   the Q tile once, then K and V tiles into rings of STAGES buffers each, K of the next tile before V of this
//   one (the order the consumers read them in). Each buffer has a "full" mbarrier (the copy's bytes arrive on it)
//   and an "empty" one (every consumer warp arrives when done reading it). K and V have their own "empty"
//   barriers: a K buffer is free once its S GEMM is done, half an iteration before the V beside it, and that
//   half iteration is what lets the next K's copy run under the matmuls instead of in front of them.
// - the consumers (warpgroups 1 ... CONS) own 64 query rows each. S = Q K^T is a wgmma with both operands in shared
//   memory; O += P V takes P from registers (S's accumulators, rounded) and V from shared memory, transposed by
//   the descriptor. Within a consumer the next tile's S GEMM is issued before this tile's P V GEMM, so the
//   softmax of one tile runs while the tensor cores work on the other (FlashAttention-3's Algorithm 2).
// - PINGPONG: the consumers take turns to issue their GEMMs (named barriers 1 ... CONS, each consumer handing the
//   turn to the next), so one's softmax runs under the others' GEMMs.
// Tiles are [D / 64][rows][64] in shared memory, 128-byte rows swizzled by TMA (16-byte chunk ^ row % 8) as
// wgmma's 128-byte-swizzle descriptors expect; buffers start on 1024-byte boundaries.

typedef unsigned long long u64;

DEVI void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
DEVI void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
DEVI void mbar_arrive(u32 bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
// try_wait with a suspend-time hint: the thread sleeps until the phase completes (or 10 ms pass) instead of
// spinning, whose instructions would take issue slots from the consumer warps of its sub-partition
DEVI void mbar_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(bar), "r"(parity), "r"(0x989680) : "memory");
}
// a box of the 3-D tensor map (d, seq, batch * heads) at coordinates (c0, c1, c2); rows past the sequence end
// arrive as zeros, and count toward the barrier's bytes all the same
DEVI void tma_load(u32 dst, const void* tmap, u32 bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5}], [%2];\n" ::"r"(dst), "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
DEVI void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
DEVI void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
DEVI void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DEVI void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> DEVI void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// keeps the compiler from moving reads or writes of accumulators across an asynchronous wgmma
template <int N> DEVI void pin(float* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> DEVI void pin(u32* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// wgmma's shared-memory descriptor, 128-byte swizzle: start address, leading and stride byte offsets (>> 4)
DEVI u64 sw128_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo >> 4) & 0x3FFF) << 16) | ((u64)((sbo >> 4) & 0x3FFF) << 32) |
           (1ull << 62);
}

// D (64 x N, fp32, C-fragment order per warp of 16 rows) = or += A B^T, A (64 x 16) and B (N x 16) in shared
// memory, both K-major
template <int N, bool BF16> DEVI void wgmma_ss(float* d, u64 da, u64 db, int acc);
// D += A B, A (64 x 16) from registers (mma.sync's A-fragment order), B (16 x N) in shared memory, N-major
template <int N, bool BF16> DEVI void wgmma_rs(float* d, const u32* a, u64 db);
// WGMMA_WRAPPERS: their specialisations for N 64, 128 and 192, fp16 and bf16, written out by
// gpu_kernels/build.py (wgmma_wrappers): each names every accumulator register

// the shared-memory plan of one block: two Q buffers (BR rows each: a work tile's and the next one's), then STAGES
// K buffers, STAGES V buffers, then the mbarriers (Q's full and empty per Q buffer; K's full, V's full, K's empty
// and V's empty per stage), then the work tile each Q buffer holds
template <int D, int BR, int BC, int STAGES>
struct Flash3Smem {
    static constexpr u32 Q = BR * D * 2, KV = BC * D * 2;
    static constexpr u32 K0 = 2 * Q, V0 = K0 + STAGES * KV, BARS = V0 + STAGES * KV, IDS = BARS + 8 * (4 + 4 * STAGES);
    static constexpr u32 BYTES = IDS + 8 + 1024;   // + 1024: the base is aligned by hand
};

// BR: the block's query rows, the row count of each 64-column chunk of the Q buffer
template <int D, int BR, int BC, bool BF16>
struct Consumer {
    float o[D / 2];   // O, this thread's part of its rows g and g + 8 (C-fragment order)
    float s[BC / 2];  // S, then P in fp32
    u32 p[BC / 4];    // P rounded to the input type: the A fragments of P V
    float m[2], l[2];

    // dq: this consumer's 64 rows of Q, dk: a K buffer, dv: a V buffer, as wgmma descriptors; a k-step further
    // along adds its byte offset >> 4 to the start address (bits 0-13), which cannot carry out of the field
    DEVI void gemm_s(u64 dq, u64 dk) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const u32 step = (kk % 4) * 32;  // 16 columns further along the swizzled 128-byte row
            wgmma_ss<BC, BF16>(s, dq + (((kk / 4) * BR * 128 + step) >> 4), dk + (((kk / 4) * BC * 128 + step) >> 4),
                               kk > 0);
        }
        wg_commit();
    }
    DEVI void gemm_pv(u64 dv) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) wgmma_rs<D, BF16>(o, p + 4 * kk, dv + ((kk * 16 * 128) >> 4));
        wg_commit();
    }

    // S -> P for key tile j: mask (MASK: a tile past the sequence's end or the causal diagonal), new running max,
    // exp2; sets alpha (the old sum's rescale)
    template <bool MASK>
    DEVI void softmax(int j, int row0, int nk, int off, bool causal, float scale_log2, float* alpha) {
        const int lane = threadIdx.x & 31, t = lane & 3, col0 = j * BC + 2 * t;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int row = row0 + 8 * hf;
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[4 * n + 2 * hf + e];
                    if (MASK) {
                        const int col = col0 + 8 * n + e;
                        if (col >= nk || (causal && col > row + off)) x = -INFINITY;
                    }
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float m_new = fmaxf(m[hf], mx * scale_log2);
            const float m_use = m_new == -INFINITY ? 0.f : m_new;
            alpha[hf] = fast_exp2(m[hf] - m_use);
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[4 * n + 2 * hf + e];
                    x = fast_exp2(fmaf(x, scale_log2, -m_use));
                    sum += x;
                }
            l[hf] = l[hf] * alpha[hf] + sum;
            m[hf] = m_new;
        }
    }
    DEVI void rescale(const float* alpha) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[4 * n] *= alpha[0], o[4 * n + 1] *= alpha[0];
            o[4 * n + 2] *= alpha[1], o[4 * n + 3] *= alpha[1];
        }
    }
    DEVI void round_p() {
#pragma unroll
        for (int i = 0; i < BC / 4; ++i) p[i] = pack2<BF16>(s[2 * i], s[2 * i + 1]);
    }
    // O straight from the fragments, 4 bytes a thread (d 64: measured faster than through shared memory)
    DEVI void store_direct(u16* O, float* L, int row0, int nq) {
        const int t = threadIdx.x & 3;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float lsum = l[hf];
            lsum += __shfl_xor_sync(0xffffffff, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffff, lsum, 2);
            const int row = row0 + 8 * hf;
            if (row >= nq) continue;
            const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *(u32*)(O + (size_t)row * D + n * 8 + 2 * t) = pack2<BF16>(o[4 * n + 2 * hf] * inv, o[4 * n + 2 * hf + 1] * inv);
            if (t == 0) L[row] = lsum > 0.f ? (m[hf] + __log2f(lsum)) * 0.6931471805599453f : -INFINITY;
        }
    }
    // d 128: O through shared memory (so: this consumer's rows of the Q buffer, free once its last S GEMM is done, laid
    // out as Q with the 16-byte chunks swizzled, so the fragment writes hit distinct banks), then 16-byte stores of
    // whole rows to global memory
    DEVI void store_staged(u16* O, float* L, int row0, int wg_row0, int nq, u32 so, int bar_id) {
        const int tid = threadIdx.x & 127, t = tid & 3, lane = tid & 31;
        float inv[2];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float lsum = l[hf];
            lsum += __shfl_xor_sync(0xffffffff, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffff, lsum, 2);
            inv[hf] = lsum > 0.f ? 1.f / lsum : 0.f;
            const int row = row0 + 8 * hf;
            if (t == 0 && row < nq) L[row] = lsum > 0.f ? (m[hf] + __log2f(lsum)) * 0.6931471805599453f : -INFINITY;
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = (tid >> 5) * 16 + (lane >> 2) + 8 * hf;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                const u32 a = so + (n / 8) * BR * 128 + r * 128 + (((n % 8) ^ (r % 8)) << 4) + 4 * t;
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(pack2<BF16>(o[4 * n + 2 * hf] * inv[hf],
                                                                                  o[4 * n + 2 * hf + 1] * inv[hf])));
            }
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(bar_id) : "memory");
#pragma unroll
        for (int i = tid; i < 64 * (D / 8); i += 128) {
            const int r = i / (D / 8), n = i % (D / 8);
            if (wg_row0 + r >= nq) continue;
            uint4 v;
            const u32 a = so + (n / 8) * BR * 128 + r * 128 + (((n % 8) ^ (r % 8)) << 4);
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
            *(uint4*)(O + (size_t)(wg_row0 + r) * D + n * 8) = v;
        }
    }
};

// tmaps: the Q, K and V tensor maps (128 bytes each, in global memory); v_lbo, v_sbo: the V descriptor's byte
// offsets between 64-column halves and between 8-key groups. Work tiles are (batch, head, BR query rows), a head's
// adjacent, longest first under q_descending. The block takes tile blockIdx.x, then blockIdx.x + gridDim.x, ... or,
// given `claims` (two ints, zero), the next unclaimed one (atomically, as a free SM would take the next block): a
// grid of one block a work tile runs each once; a grid of one block an SM is persistent, and its producer loads
// the next tile's Q and first K and V while the consumers finish this one. The producer names each Q buffer's tile
// to the consumers (-1: no more); the last block done with `claims` sets them back to zero.
template <int D, int BC, int STAGES, int CONS, bool PINGPONG, bool BF16>
__global__ void __launch_bounds__(128 * (CONS + 1), 1) flash3_fwd(const u64* __restrict__ tmaps, u16* __restrict__ O,
                                                      float* __restrict__ L, int B, int H, int HKV, int NQ, int NK,
                                                      float scale_log2, int causal, int q_descending, u32 v_lbo,
                                                      u32 v_sbo, int* __restrict__ claims) {
    constexpr int BR = 64 * CONS;
    using SM = Flash3Smem<D, BR, BC, STAGES>;
    static_assert(D % 64 == 0 && BC % 16 == 0 && BC <= 256, "head_dim a multiple of 64; block_kv of 16");
    static_assert(CONS == 2 || CONS == 3, "two or three consumer warpgroups");
    // registers a thread: the producer's and the consumers' within the SM's 64 K
    constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = CONS == 2 ? 240 : 160;
    static_assert(128 * (PRODUCER_REGS + CONS * CONSUMER_REGS) <= 65536, "registers past the SM's");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
    const u32 bars = base + SM::BARS;
    auto q_buf = [&](int n) { return base + (n & 1) * SM::Q; };
    auto q_full = [&](int n) { return bars + 8 * (n & 1); };
    auto q_empty = [&](int n) { return bars + 8 * (2 + (n & 1)); };
    auto k_full = [&](int s) { return bars + 8 * (4 + s); };
    auto v_full = [&](int s) { return bars + 8 * (4 + STAGES + s); };
    auto k_empty = [&](int s) { return bars + 8 * (4 + 2 * STAGES + s); };
    auto v_empty = [&](int s) { return bars + 8 * (4 + 3 * STAGES + s); };
    auto tile_id = [&](int n) { return base + SM::IDS + 4 * (n & 1); };

    const int nqb = (NQ + BR - 1) / BR, tiles = B * H * nqb, off = NK - NQ;
    const int wg = threadIdx.x / 128;
    // work tile w's head (b * H + h), its first query row and its key tiles
    auto work = [&](int w, int& bh, int& q0) {
        const int qi = w % nqb, qb = q_descending ? nqb - 1 - qi : qi;
        bh = w / nqb, q0 = qb * BR;
        return visible_tiles(qb, BR, BC, NQ, NK, causal);
    };

    if (threadIdx.x == 0) {
        for (int n = 0; n < 2; ++n) mbar_init(q_full(n), 1), mbar_init(q_empty(n), 4 * CONS);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(k_full(s), 1), mbar_init(v_full(s), 1);
            mbar_init(k_empty(s), 4 * CONS), mbar_init(v_empty(s), 4 * CONS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // n: the block's work tiles so far (its Q buffer and phase); it: its K/V tiles so far (their ring's)
    if (wg == 0) {  // the producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (threadIdx.x == 0) {
            const u64 *tq = tmaps, *tk = tmaps + 16, *tv = tmaps + 32;
            auto load = [&](int j, u32 buf0, const u64* tmap, u32 full, u32 empty, int kvbh, int jt) {
                const int s = j % STAGES;
                if (j >= STAGES) mbar_wait(empty + 8 * s, ((j / STAGES) - 1) & 1);
                mbar_expect_tx(full + 8 * s, SM::KV);
                for (int c = 0; c < D / 64; ++c)
                    tma_load(buf0 + s * SM::KV + c * BC * 128, tmap, full + 8 * s, c * 64, jt * BC, kvbh);
            };
            int it = 0, n = 0;
            for (int w = blockIdx.x; w < tiles; ++n) {
                int bh, q0;
                const int nt = work(w, bh, q0), kvbh = (bh / H) * HKV + (bh % H) / (H / HKV);
                // the first K before Q: its buffer frees early, Q's only when the tile before last is stored
                if (nt > 0) load(it, base + SM::K0, tk, k_full(0), k_empty(0), kvbh, 0);
                if (n >= 2) mbar_wait(q_empty(n), ((n / 2) - 1) & 1);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile_id(n)), "r"(w) : "memory");
                mbar_expect_tx(q_full(n), SM::Q);
                for (int c = 0; c < D / 64; ++c) tma_load(q_buf(n) + c * BR * 128, tq, q_full(n), c * 64, q0, bh);
                for (int j = 0; j < nt; ++j) {
                    if (j + 1 < nt) load(it + j + 1, base + SM::K0, tk, k_full(0), k_empty(0), kvbh, j + 1);
                    load(it + j, base + SM::V0, tv, v_full(0), v_empty(0), kvbh, j);
                }
                it += nt;
                w = claims ? atomicAdd(claims, 1) + (int)gridDim.x : w + (int)gridDim.x;
            }
            if (n >= 2) mbar_wait(q_empty(n), ((n / 2) - 1) & 1);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile_id(n)), "r"(-1) : "memory");
            mbar_arrive(q_full(n));
            if (claims) {
                __threadfence();
                if (atomicAdd(claims + 1, 1) == (int)gridDim.x - 1) atomicExch(claims, 0), atomicExch(claims + 1, 0);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1, tid = threadIdx.x & 127, lane = tid & 31;
    const u64 dk0 = sw128_desc(base + SM::K0, 16, 1024), dv0 = sw128_desc(base + SM::V0, v_lbo, v_sbo);
    // the turn: consumer cw waits on barrier 1 + cw and hands it on to barrier 1 + (cw + 1) % CONS
    const int my_turn = 1 + cw, next_turn = 1 + (cw + 1) % CONS;
    auto release = [&](u32 empty) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty);
    };
    Consumer<D, BR, BC, BF16> c;
    // the turn passes round the consumers across work tiles: every consumer takes nt + 1 turns a tile
    if (PINGPONG && cw == CONS - 1) named_arrive(1);  // consumer 0 goes first
    int it = 0;
    for (int n = 0;; ++n) {
        mbar_wait(q_full(n), (n / 2) & 1);
        int w, bh, q0;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(tile_id(n)) : "memory");
        if (w < 0) break;
        const int nt = work(w, bh, q0);
        const int row0 = q0 + cw * 64 + (tid >> 5) * 16 + (lane >> 2);  // this thread's rows: row0 and row0 + 8
        const int warp_first = q0 + cw * 64 + (tid >> 5) * 16;            // a tile past its diagonal needs the mask
        const u32 sq = q_buf(n) + cw * 64 * 128;
#pragma unroll
        for (int i = 0; i < D / 2; ++i) c.o[i] = 0.f;
        c.m[0] = c.m[1] = -INFINITY;
        c.l[0] = c.l[1] = 0.f;
        float alpha[2];
        auto edge = [&](int j) { return (j + 1) * BC > NK || (causal && (j + 1) * BC - 1 > warp_first + off); };
        const u64 dq = sw128_desc(sq, 16, 1024);
        auto kdesc = [&](int j) { return dk0 + ((((it + j) % STAGES) * SM::KV) >> 4); };
        auto vdesc = [&](int j) { return dv0 + ((((it + j) % STAGES) * SM::KV) >> 4); };
        auto full_phase = [&](int j) { return ((it + j) / STAGES) & 1; };
        auto softmax = [&](int j) {
            if (edge(j)) c.template softmax<true>(j, row0, NK, off, causal, scale_log2, alpha);
            else c.template softmax<false>(j, row0, NK, off, causal, scale_log2, alpha);
        };
        if (nt > 0) {
            mbar_wait(k_full(it % STAGES), full_phase(0));
            if (PINGPONG) named_sync(my_turn);
            c.gemm_s(dq, kdesc(0));
            if (PINGPONG) named_arrive(next_turn);
            wg_wait<0>();
            pin<BC / 2>(c.s);
            release(k_empty(it % STAGES));
            softmax(0);
            c.round_p();
            for (int j = 1; j < nt; ++j) {
                mbar_wait(k_full((it + j) % STAGES), full_phase(j));
                if (PINGPONG) named_sync(my_turn);
                c.gemm_s(dq, kdesc(j));
                mbar_wait(v_full((it + j - 1) % STAGES), full_phase(j - 1));
                c.gemm_pv(vdesc(j - 1));
                if (PINGPONG) named_arrive(next_turn);
                wg_wait<1>();  // S of tile j is in; P V of tile j - 1 may still run
                pin<BC / 2>(c.s);
                release(k_empty((it + j) % STAGES));
                softmax(j);
                wg_wait<0>();
                pin<D / 2>(c.o);
                pin<BC / 4>(c.p);
                release(v_empty((it + j - 1) % STAGES));
                c.rescale(alpha);
                c.round_p();
            }
            mbar_wait(v_full((it + nt - 1) % STAGES), full_phase(nt - 1));
            if (PINGPONG) named_sync(my_turn);
            c.gemm_pv(vdesc(nt - 1));
            if (PINGPONG) named_arrive(next_turn);
            wg_wait<0>();
            pin<D / 2>(c.o);
            release(v_empty((it + nt - 1) % STAGES));
        }
        const int bhq = bh * NQ;
        if constexpr (D >= 128) c.store_staged(O + (size_t)bhq * D, L + bhq, row0, q0 + cw * 64, NQ, sq, 1 + CONS + cw);
        else c.store_direct(O + (size_t)bhq * D, L + bhq, row0, NQ);
        // this consumer's rows of the Q buffer are read and (d 128) O staged through them: the generic proxy's
        // writes ordered before the next Q's copy into them
        if constexpr (D >= 128) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        release(q_empty(n));
        it += nt;
    }
    if (PINGPONG && cw == 0) named_sync(1);  // the turn the last consumer gave last, never taken
}

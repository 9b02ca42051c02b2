// Tiled attention backward passes (flash2: FlashAttention-2's order, one block per key tile; flash1: the paper's
// Algorithm 4, one block per head, key tiles outer) and naive attention's softmax gradient. Compiled after
// attention.cu, whose PTX wrappers and swizzled tiles it uses.
//
// A block holds BC = 16 * WARPS keys; warp w owns keys 16w .. 16w + 15 of the tile, so its dK and dV rows stay in
// its registers for the whole block. Per query block of BR rows (in chunks of QC), each warp computes
//   S^T = K_w Q^T,  P^T = exp2(S^T * scale_log2 - L * log2 e)   (recomputed, never stored)
//   dP^T = V_w dO^T,  dS^T = P^T * (dP^T - D)                 (D = rowsum(dO * O))
//   dV_w += P^T dO,  dK_w += dS^T Q
// with keys as the mma's rows: P^T and dS^T come out of one mma as C fragments and go straight into the next as
// A fragments, the forward's trick, with no transpose through shared memory. dS^T is staged once in shared memory
// ([key][query], swizzled) for dQ = dS K, which the warps share out by query rows; flash2 adds dQ into an fp32
// accumulator by atomics (red.global.add), flash1 loads, adds and stores it (its block owns the head).
// dK is scaled by the softmax scale here; dQ's scale is applied when the accumulator is converted.

DEVI void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

DEVI void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900  // one vector reduction for two floats (PTX 8.1, sm_90)
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(a) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p + 1), "f"(b) : "memory");
#endif
}

// n floats [row0, row0 + n) of a vector into shared memory, zero past `end`
template <int N, int THREADS>
DEVI void load_stat(float* s, const float* g, int row0, int end) {
    for (int i = threadIdx.x; i < N; i += THREADS) {
        const bool valid = row0 + i < end;
        cp_async4(s + i, valid ? g + row0 + i : g, valid);
    }
}

template <int D, int BR, int QC, int WARPS, bool BF16>
struct BwdWarp {
    static constexpr int BC = 16 * WARPS;
    static_assert(BR % QC == 0 && QC % 16 == 0 && D % 64 == 0, "query chunks of 16k rows; head_dim 64k");
    float dk[D / 8][4], dv[D / 8][4];  // this warp's 16 keys x D, mma C layout (rows g, g + 8; columns 2t, 2t+1)

    DEVI void init() {
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
    }

    // One query block: its Q and dO rows in sQ, sdO, their L and D in sL, sD (rows from q0); this warp's keys
    // from key0 = k0 + 16 * warp. Writes this warp's rows of dS^T into sdS.
    DEVI void step(const u16* sK, const u16* sV, const u16* sQ, const u16* sdO, const float* sL, const float* sD,
                   u16* sdS, int q0, int k0, int nq, int nk, int off, bool causal, float scale_log2) {
        const int warp = threadIdx.x >> 5, key0 = k0 + warp * 16;
#pragma unroll 1
        for (int qc = 0; qc < BR; qc += QC) {
            const int first = q0 + qc, last = q0 + qc + QC - 1;  // query rows of this chunk
            if (first >= nq || key0 >= nk || (causal && key0 > last + off)) {
                zero_ds(sdS, qc);  // nothing this warp's keys see here
            } else if (key0 + 16 > nk || (causal && key0 + 15 > first + off)) {
                chunk<true>(sK, sV, sQ, sdO, sL, sD, sdS, qc, q0, key0, nk, off, causal, scale_log2);
            } else {
                chunk<false>(sK, sV, sQ, sdO, sL, sD, sdS, qc, q0, key0, nk, off, causal, scale_log2);
            }
        }
    }

    DEVI void zero_ds(u16* sdS, int qc) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, row = (threadIdx.x >> 5) * 16 + g;
#pragma unroll
        for (int n = 0; n < QC / 8; ++n) {
            const int col = qc + n * 8 + 2 * t;
            *(u32*)(sdS + swz<BR>(row, col >> 3) + (col & 7)) = 0u;
            *(u32*)(sdS + swz<BR>(row + 8, col >> 3) + (col & 7)) = 0u;
        }
    }

    template <bool EDGE>
    DEVI void chunk(const u16* sK, const u16* sV, const u16* sQ, const u16* sdO, const float* sL, const float* sD,
                    u16* sdS, int qc, int q0, int key0, int nk, int off, bool causal, float scale_log2) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wrow = (threadIdx.x >> 5) * 16;
        // A operands (this warp's 16 key rows), B operands (query rows as columns), B transposed (query rows as k)
        const u32 k_a = frag_base<D>(sK, wrow + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 v_a = frag_base<D>(sV, wrow + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 q_b = frag_base<D>(sQ, qc + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        const u32 do_b = frag_base<D>(sdO, qc + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        float s[QC / 8][4], dp[QC / 8][4];
#pragma unroll
        for (int n = 0; n < QC / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            u32 ak[4], av[4];
            ldmatrix_x4(ak, k_a ^ (k << 5));
            ldmatrix_x4(av, v_a ^ (k << 5));
#pragma unroll
            for (int n = 0; n < QC / 16; ++n) {
                u32 b[4];
                ldmatrix_x4(b, (q_b ^ (k << 5)) + n * 16 * 2 * D);
                mma16816<BF16>(s[2 * n], ak, b);
                mma16816<BF16>(s[2 * n + 1], ak, b + 2);
                ldmatrix_x4(b, (do_b ^ (k << 5)) + n * 16 * 2 * D);
                mma16816<BF16>(dp[2 * n], av, b);
                mma16816<BF16>(dp[2 * n + 1], av, b + 2);
            }
        }
        // P^T, masked to zero (keys past the end, keys right of a query's diagonal), and dS^T in place of dP^T
#pragma unroll
        for (int n = 0; n < QC / 8; ++n) {
            const int col = qc + n * 8 + 2 * t;
            const float2 lse = *(const float2*)(sL + col), dsum = *(const float2*)(sD + col);
            const float l2[2] = {lse.x * 1.4426950408889634f, lse.y * 1.4426950408889634f};
            const float dd[2] = {dsum.x, dsum.y};
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float p = fast_exp2(fmaf(s[n][2 * hf + e], scale_log2, -l2[e]));
                    if (EDGE) {
                        const int key = key0 + g + 8 * hf;
                        if (key >= nk || (causal && key > q0 + col + e + off)) p = 0.f;
                    }
                    s[n][2 * hf + e] = p;
                    dp[n][2 * hf + e] = p * (dp[n][2 * hf + e] - dd[e]);
                }
        }
        // dV += P^T dO and dK += dS^T Q: k = 16 queries, dO and Q rows loaded transposed
        const u32 do_t = frag_base<D>(sdO, qc + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 q_t = frag_base<D>(sQ, qc + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
#pragma unroll
        for (int kk = 0; kk < QC / 16; ++kk) {
            u32 ap[4], ad[4];
            ap[0] = pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
            ap[1] = pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
            ap[2] = pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            ap[3] = pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            ad[0] = pack2<BF16>(dp[2 * kk][0], dp[2 * kk][1]);
            ad[1] = pack2<BF16>(dp[2 * kk][2], dp[2 * kk][3]);
            ad[2] = pack2<BF16>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            ad[3] = pack2<BF16>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
            // dS^T to shared memory for dQ, as 16-bit pairs (query 2t, 2t + 1) of key rows g and g + 8
            const int c0 = qc + kk * 16 + 2 * t, row = wrow + g;
            *(u32*)(sdS + swz<BR>(row, c0 >> 3) + (c0 & 7)) = ad[0];
            *(u32*)(sdS + swz<BR>(row + 8, c0 >> 3) + (c0 & 7)) = ad[1];
            *(u32*)(sdS + swz<BR>(row, (c0 + 8) >> 3) + (c0 & 7)) = ad[2];
            *(u32*)(sdS + swz<BR>(row + 8, (c0 + 8) >> 3) + (c0 & 7)) = ad[3];
#pragma unroll
            for (int n = 0; n < D / 16; ++n) {
                u32 b[4];
                ldmatrix_x4_trans(b, (do_t ^ (n << 5)) + kk * 16 * 2 * D);
                mma16816<BF16>(dv[2 * n], ap, b);
                mma16816<BF16>(dv[2 * n + 1], ap, b + 2);
                ldmatrix_x4_trans(b, (q_t ^ (n << 5)) + kk * 16 * 2 * D);
                mma16816<BF16>(dk[2 * n], ad, b);
                mma16816<BF16>(dk[2 * n + 1], ad, b + 2);
            }
        }
    }

    // dK (scaled) and dV rows of this warp's keys below nk, in the input dtype
    DEVI void store(u16* dK, u16* dV, int k0, int nk, float scale) const {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, key0 = k0 + (threadIdx.x >> 5) * 16;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int key = key0 + g + 8 * hf;
            if (key >= nk) continue;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                *(u32*)(dK + (size_t)key * D + n * 8 + 2 * t) =
                    pack2<BF16>(dk[n][2 * hf] * scale, dk[n][2 * hf + 1] * scale);
                *(u32*)(dV + (size_t)key * D + n * 8 + 2 * t) = pack2<BF16>(dv[n][2 * hf], dv[n][2 * hf + 1]);
            }
        }
    }
};

// dQ_i += dS K for one query block, the warps sharing out its rows (32 a warp: two m-tiles share each K fragment)
// and head_dim columns; ATOMIC: by reductions in L2 (flash2, blocks of one head race), else by load, add, store
// (flash1, one block a head)
template <int D, int BR, int WARPS, bool BF16, bool ATOMIC>
DEVI void dq_update(const u16* sdS, const u16* sK, float* dQ, int q0, int nq) {
    constexpr int BC = 16 * WARPS, MQ = 2, WM = BR / (16 * MQ), WN = WARPS / WM, NT = D / WN / 8;
    static_assert(WM * 16 * MQ == BR && WN * WM == WARPS && NT % 2 == 0, "warps must split BR x D evenly");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    if (q0 + wm * 16 * MQ >= nq) return;
    const u32 a_t = frag_base<BR>(sdS, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const u32 k_t = frag_base<D>(sK, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
    float acc[MQ][NT][4];
#pragma unroll
    for (int m = 0; m < MQ; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
        u32 a[MQ][4];
#pragma unroll
        for (int m = 0; m < MQ; ++m) ldmatrix_x4_trans(a[m], (a_t ^ ((wm * MQ + m) << 5)) + kk * 16 * 2 * BR);
#pragma unroll
        for (int n = 0; n < NT / 2; ++n) {
            u32 b[4];
            ldmatrix_x4_trans(b, (k_t ^ ((wn * NT / 2 + n) << 5)) + kk * 16 * 2 * D);
#pragma unroll
            for (int m = 0; m < MQ; ++m) {
                mma16816<BF16>(acc[m][2 * n], a[m], b);
                mma16816<BF16>(acc[m][2 * n + 1], a[m], b + 2);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MQ; ++m)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int row = q0 + (wm * MQ + m) * 16 + g + 8 * hf;
            if (row >= nq) continue;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                float* p = dQ + (size_t)row * D + (wn * NT + n) * 8 + 2 * t;
                if (ATOMIC) {
                    red_add2(p, acc[m][n][2 * hf], acc[m][n][2 * hf + 1]);
                } else {
                    float2 v = *(float2*)p;
                    *(float2*)p = make_float2(v.x + acc[m][n][2 * hf], v.y + acc[m][n][2 * hf + 1]);
                }
            }
        }
}

// first query block that sees key tile j (all blocks from it on do; nqb if none)
DEVI int first_visible(int j, int BR, int BC, int nq, int nk, bool causal) {
    const int nqb = (nq + BR - 1) / BR;
    int i = 0;
    while (i < nqb && visible_tiles(i, BR, BC, nq, nk, causal) <= j) ++i;
    return i;
}

template <int D, int WARPS>
constexpr int bwd_min_blocks() {  // registers: dK, dV and the chunk's S and dP (QC <= 64) a thread, plus addresses
    constexpr int regs = D + 64 + 64;
    constexpr int n = 65536 / (WARPS * 32 * regs);
    return n < 1 ? 1 : n;
}

// ---- flash2 backward, FlashAttention-2's warp layout: P^T and dS^T through shared memory ----------------------
//
// The layout above reads a query block's Q and dO rows once a warp for each of its four products (16 keys a warp),
// 720 KB of shared-memory reads a 64x128 (d 128) step. Here the warps split the step twice, as FlashAttention-2's
// backward does (its AtomLayoutMSdP 2, AtomLayoutNdKV 4): for S^T and dP^T, WARPS / 2 key groups of 32 x 2 query
// halves; P^T and dS^T go to shared memory; for dV and dK, the key groups x 2 head_dim halves. 608 KB a step, one
// barrier more. The accumulators a thread holds are the same count (32 keys x D / 2, twice).
template <int D, int BR, int WARPS, bool BF16>
struct BwdSplitWarp {
    static constexpr int KG = WARPS / 2, BC = 32 * KG, QW = BR / 2, DW = D / 2;
    static_assert(BC == 16 * WARPS && QW % 16 == 0 && DW % 16 == 0, "32 keys a warp, 16k queries and d a half");
    float dk[2][DW / 8][4], dv[2][DW / 8][4];  // keys 32 kg + 16 m + (g, g + 8) x head_dim DW dh + 8 n + (2t, 2t+1)
    u16* sP;                                    // P^T, [key][query]

    // One query block, as BwdWarp::step: P^T and dS^T of the block's (key group, query half), a barrier, then dV
    // and dK of its (key group, head_dim half)
    DEVI void step(const u16* sK, const u16* sV, const u16* sQ, const u16* sdO, const float* sL, const float* sD,
                   u16* sdS, int q0, int k0, int nq, int nk, int off, bool causal, float scale_log2) {
        scores(sK, sV, sQ, sdO, sL, sD, sdS, q0, k0, nq, nk, off, causal, scale_log2);
        __syncthreads();
        grads(sQ, sdO, sdS);
    }

    DEVI void init() {
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < DW / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) dk[m][n][e] = dv[m][n][e] = 0.f;
    }

    // P^T and dS^T of this warp's 32 keys x QW queries into sP and sdS ([key][query] tiles, BR queries a row)
    DEVI void scores(const u16* sK, const u16* sV, const u16* sQ, const u16* sdO, const float* sL, const float* sD,
                     u16* sdS, int q0, int k0, int nq, int nk, int off, bool causal, float scale_log2) {
        const int warp = threadIdx.x >> 5, kg = warp % KG, qh = warp / KG;
        const int key0 = k0 + 32 * kg, first = q0 + qh * QW, last = first + QW - 1;
        if (first >= nq || key0 >= nk || (causal && key0 > last + off)) {
            put<false>(sdS, nullptr, nullptr, kg, qh);   // nothing these keys see here
        } else if (key0 + 32 > nk || (causal && key0 + 31 > first + off)) {
            scores_<true>(sK, sV, sQ, sdO, sL, sD, sdS, kg, qh, q0, key0, nk, off, causal, scale_log2);
        } else {
            scores_<false>(sK, sV, sQ, sdO, sL, sD, sdS, kg, qh, q0, key0, nk, off, causal, scale_log2);
        }
    }

    template <bool EDGE>
    DEVI void scores_(const u16* sK, const u16* sV, const u16* sQ, const u16* sdO, const float* sL, const float* sD,
                      u16* sdS, int kg, int qh, int q0, int key0, int nk, int off, bool causal,
                      float scale_log2) {
        const int lane = threadIdx.x & 31, t = lane & 3;
        const u32 k_a = frag_base<D>(sK, 32 * kg + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 v_a = frag_base<D>(sV, 32 * kg + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 q_b = frag_base<D>(sQ, qh * QW + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        const u32 do_b = frag_base<D>(sdO, qh * QW + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
        float s[2][QW / 8][4], dp[2][QW / 8][4];
        zero(s);
        zero(dp);
        products(k_a, q_b, s);
        products(v_a, do_b, dp);
        probs<EDGE>(s, sL, kg, qh, q0, key0, nk, off, causal, scale_log2);
        // dS^T = P^T (dP^T - D) in place of dP^T
#pragma unroll
        for (int n = 0; n < QW / 8; ++n) {
            const float2 dsum = *(const float2*)(sD + qh * QW + n * 8 + 2 * t);
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    dp[m][n][2 * hf] = s[m][n][2 * hf] * (dp[m][n][2 * hf] - dsum.x);
                    dp[m][n][2 * hf + 1] = s[m][n][2 * hf + 1] * (dp[m][n][2 * hf + 1] - dsum.y);
                }
        }
        put<true>(sdS, s, dp, kg, qh);
    }

    DEVI static void zero(float (*x)[QW / 8][4]) {
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < QW / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) x[m][n][e] = 0.f;
    }

    // acc += A B^T over head_dim: A this warp's 32 rows of K or V, B its QW rows of Q or dO
    DEVI static void products(u32 a_base, u32 b_base, float (*acc)[QW / 8][4]) {
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            u32 a[2][4], b[QW / 16][4];
#pragma unroll
            for (int m = 0; m < 2; ++m) ldmatrix_x4(a[m], (a_base ^ (k << 5)) + m * 16 * 2 * D);
#pragma unroll
            for (int n = 0; n < QW / 16; ++n) ldmatrix_x4(b[n], (b_base ^ (k << 5)) + n * 16 * 2 * D);
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int n = 0; n < QW / 16; ++n) {
                    mma16816<BF16>(acc[m][2 * n], a[m], b[n]);
                    mma16816<BF16>(acc[m][2 * n + 1], a[m], b[n] + 2);
                }
        }
    }

    // S^T -> P^T in place, masked to zero (keys past the end, keys right of a query's diagonal)
    template <bool EDGE>
    DEVI static void probs(float (*s)[QW / 8][4], const float* sL, int kg, int qh, int q0, int key0, int nk, int off,
                           bool causal, float scale_log2) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int n = 0; n < QW / 8; ++n) {
            const int col = qh * QW + n * 8 + 2 * t;
            const float2 lse = *(const float2*)(sL + col);
            const float l2[2] = {lse.x * 1.4426950408889634f, lse.y * 1.4426950408889634f};
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float p = fast_exp2(fmaf(s[m][n][2 * hf + e], scale_log2, -l2[e]));
                        if (EDGE) {
                            const int key = key0 + 16 * m + g + 8 * hf;
                            if (key >= nk || (causal && key > q0 + col + e + off)) p = 0.f;
                        }
                        s[m][n][2 * hf + e] = p;
                    }
        }
    }

    // this warp's 32 x QW block of P^T and dS^T as 16-bit pairs (queries 2t, 2t + 1 of key rows g, g + 8); zeros
    // without values
    template <bool VALUES>
    DEVI void put(u16* sdS, const float (*s)[QW / 8][4], const float (*dp)[QW / 8][4], int kg, int qh) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < QW / 8; ++n)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int row = 32 * kg + 16 * m + g + 8 * hf, col = qh * QW + n * 8 + 2 * t;
                    const int at = swz<BR>(row, col >> 3) + (col & 7);
                    *(u32*)(sP + at) = VALUES ? pack2<BF16>(s[m][n][2 * hf], s[m][n][2 * hf + 1]) : 0u;
                    *(u32*)(sdS + at) = VALUES ? pack2<BF16>(dp[m][n][2 * hf], dp[m][n][2 * hf + 1]) : 0u;
                }
    }

    // dV += P^T dO and dK += dS^T Q for this warp's 32 keys x D / 2 columns of head_dim, k = the BR queries
    DEVI void grads(const u16* sQ, const u16* sdO, const u16* sdS) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kg = warp % KG, dh = warp / KG;
        const u32 p_a = frag_base<BR>(sP, 32 * kg + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 ds_a = frag_base<BR>(sdS, 32 * kg + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 do_t = frag_base<D>(sdO, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
        const u32 q_t = frag_base<D>(sQ, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) {
            u32 ap[2][4], ad[2][4];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                ldmatrix_x4(ap[m], (p_a ^ (kk << 5)) + m * 16 * 2 * BR);
                ldmatrix_x4(ad[m], (ds_a ^ (kk << 5)) + m * 16 * 2 * BR);
            }
#pragma unroll
            for (int n = 0; n < DW / 16; ++n) {
                u32 b[4];
                ldmatrix_x4_trans(b, (do_t ^ ((dh * DW / 16 + n) << 5)) + kk * 16 * 2 * D);
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    mma16816<BF16>(dv[m][2 * n], ap[m], b);
                    mma16816<BF16>(dv[m][2 * n + 1], ap[m], b + 2);
                }
                ldmatrix_x4_trans(b, (q_t ^ ((dh * DW / 16 + n) << 5)) + kk * 16 * 2 * D);
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    mma16816<BF16>(dk[m][2 * n], ad[m], b);
                    mma16816<BF16>(dk[m][2 * n + 1], ad[m], b + 2);
                }
            }
        }
    }

    // dK (scaled) and dV of this warp's keys below nk and its half of head_dim, in the input dtype
    DEVI void store(u16* dK, u16* dV, int k0, int nk, float scale) const {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        const int key0 = k0 + 32 * (warp % KG), c0 = DW * (warp / KG);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int key = key0 + 16 * m + g + 8 * hf;
                if (key >= nk) continue;
#pragma unroll
                for (int n = 0; n < DW / 8; ++n) {
                    const size_t at = (size_t)key * D + c0 + n * 8 + 2 * t;
                    *(u32*)(dK + at) = pack2<BF16>(dk[m][n][2 * hf] * scale, dk[m][n][2 * hf + 1] * scale);
                    *(u32*)(dV + at) = pack2<BF16>(dv[m][n][2 * hf], dv[m][n][2 * hf + 1]);
                }
            }
    }
};

// ---- flash2 backward: one block per (batch, head, key tile), key tile fastest --------------------------------

// The block's loop, either warp layout W; `split`: W stages P^T (BC x BR) in shared memory after dS^T's buffers
template <class W, int D, int BR, int WARPS, bool BF16, bool SPLIT>
DEVI void flash2_bwd_block(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
                           const u16* __restrict__ dO, const float* __restrict__ L, const float* __restrict__ Dsum,
                           float* __restrict__ dQacc, u16* __restrict__ dK, u16* __restrict__ dV, int H, int HKV,
                           int NQ, int NK, float scale_log2, float scale, int causal) {
    constexpr int BC = 16 * WARPS, THREADS = WARPS * 32;
    extern __shared__ __align__(1024) unsigned char smem_bytes[];
    u16* sK = (u16*)smem_bytes;
    u16* sV = sK + BC * D;
    u16* sQ = sV + BC * D;        // two buffers of Q and of dO
    u16* sdO = sQ + 2 * BR * D;
    u16* sdS = sdO + 2 * BR * D;  // two buffers of dS^T, [key][query]
    u16* sP = sdS + 2 * BC * BR;  // the split layout's P^T
    float* sL = (float*)(sP + (SPLIT ? BC * BR : 0));
    float* sD = sL + 2 * BR;

    const int nkb = (NK + BC - 1) / BC;
    const int j = blockIdx.x % nkb, bh = blockIdx.x / nkb, b = bh / H, h = bh % H, kvh = h / (H / HKV);
    const size_t kv_off = (size_t)(b * HKV + kvh) * NK * D, q_off = (size_t)bh * NQ * D;
    const int k0 = j * BC, off = NK - NQ, nqb = (NQ + BR - 1) / BR;
    const int i0 = first_visible(j, BR, BC, NQ, NK, causal);
    auto load_q = [&](int i, int nb) {
        load_tile<BR, D, THREADS>(sQ + nb * BR * D, Q + q_off, i * BR, NQ);
        load_tile<BR, D, THREADS>(sdO + nb * BR * D, dO + q_off, i * BR, NQ);
        load_stat<BR, THREADS>(sL + nb * BR, L + (size_t)bh * NQ, i * BR, NQ);
        load_stat<BR, THREADS>(sD + nb * BR, Dsum + (size_t)bh * NQ, i * BR, NQ);
    };

    W w;
    w.init();
    if constexpr (SPLIT) w.sP = sP;
    load_tile<BC, D, THREADS>(sK, K + kv_off, k0, NK);
    load_tile<BC, D, THREADS>(sV, V + kv_off, k0, NK);
    if (i0 < nqb) load_q(i0, 0);
    cp_async_commit();
    // A barrier opens each query block: after it, block i's rows are in and every warp is done with block i - 1's
    // step, so block i + 1's rows load into i - 1's buffers, and block i - 1's dQ (its dS^T complete in the other
    // dS^T buffer) is added while warps run block i's step
    for (int i = i0; i < nqb; ++i) {
        const int buf = (i - i0) & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (i + 1 < nqb) {
            load_q(i + 1, buf ^ 1);
            cp_async_commit();
        }
        if (i > i0) dq_update<D, BR, WARPS, BF16, true>(sdS + (buf ^ 1) * BC * BR, sK, dQacc + q_off, (i - 1) * BR, NQ);
        w.step(sK, sV, sQ + buf * BR * D, sdO + buf * BR * D, sL + buf * BR, sD + buf * BR, sdS + buf * BC * BR, i * BR,
               k0, NQ, NK, off, causal, scale_log2);
    }
    if (i0 < nqb) {
        __syncthreads();
        dq_update<D, BR, WARPS, BF16, true>(sdS + ((nqb - 1 - i0) & 1) * BC * BR, sK, dQacc + q_off, (nqb - 1) * BR, NQ);
    }
    w.store(dK + (size_t)bh * NK * D, dV + (size_t)bh * NK * D, k0, NK, scale);
}

#define FLASH2_BWD_ARGS                                                                                          \
    const u16 *__restrict__ Q, const u16 *__restrict__ K, const u16 *__restrict__ V, const u16 *__restrict__ dO, \
        const float *__restrict__ L, const float *__restrict__ Dsum, float *__restrict__ dQacc,                  \
        u16 *__restrict__ dK, u16 *__restrict__ dV, int B, int H, int HKV, int NQ, int NK, float scale_log2,     \
        float scale, int causal

template <int D, int BR, int QC, int WARPS, bool BF16>
__global__ void __launch_bounds__(WARPS * 32, (bwd_min_blocks<D, WARPS>())) flash2_bwd(FLASH2_BWD_ARGS) {
    flash2_bwd_block<BwdWarp<D, BR, QC, WARPS, BF16>, D, BR, WARPS, BF16, false>(Q, K, V, dO, L, Dsum, dQacc, dK, dV, H, HKV,
                                                                         NQ, NK, scale_log2, scale, causal);
}

template <int D, int BR, int WARPS, bool BF16>
__global__ void __launch_bounds__(WARPS * 32, 1) flash2_bwd_split(FLASH2_BWD_ARGS) {
    flash2_bwd_block<BwdSplitWarp<D, BR, WARPS, BF16>, D, BR, WARPS, BF16, true>(Q, K, V, dO, L, Dsum, dQacc, dK, dV, H,
                                                                         HKV, NQ, NK, scale_log2, scale, causal);
}

// ---- flash1 backward: one block per (batch, head); key tiles outer, the query blocks that see each inner -------

template <int D, int BR, int QC, int WARPS, bool BF16>
__global__ void __launch_bounds__(WARPS * 32)
    flash1_bwd(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
               const u16* __restrict__ O, const u16* __restrict__ dO, const float* __restrict__ L,
               float* __restrict__ dQacc, u16* __restrict__ dK, u16* __restrict__ dV, int B, int H, int NQ, int NK,
               float scale_log2, float scale, int causal) {
    constexpr int BC = 16 * WARPS, THREADS = WARPS * 32;
    extern __shared__ __align__(1024) unsigned char smem_bytes[];
    u16* sK = (u16*)smem_bytes;
    u16* sV = sK + BC * D;
    u16* sQ = sV + BC * D;  // two buffers each of Q, dO and O
    u16* sdO = sQ + 2 * BR * D;
    u16* sO = sdO + 2 * BR * D;
    u16* sdS = sO + 2 * BR * D;
    float* sL = (float*)(sdS + BC * BR);
    float* sD = sL + 2 * BR;  // D_i, recomputed from dO_i and O_i at every visit

    const int bh = blockIdx.x;
    const size_t off_kv = (size_t)bh * NK * D, off_q = (size_t)bh * NQ * D;
    const int off = NK - NQ, nqb = (NQ + BR - 1) / BR, nkb = (NK + BC - 1) / BC;
    float* dq = dQacc + off_q;
    for (int j = 0; j < nkb; ++j) {
        const int k0 = j * BC, i0 = first_visible(j, BR, BC, NQ, NK, causal);
        BwdWarp<D, BR, QC, WARPS, BF16> w;
        w.init();
        auto load_q = [&](int i, int nb) {
            load_tile<BR, D, THREADS>(sQ + nb * BR * D, Q + off_q, i * BR, NQ);
            load_tile<BR, D, THREADS>(sdO + nb * BR * D, dO + off_q, i * BR, NQ);
            load_tile<BR, D, THREADS>(sO + nb * BR * D, O + off_q, i * BR, NQ);
            load_stat<BR, THREADS>(sL + nb * BR, L + (size_t)bh * NQ, i * BR, NQ);
        };
        load_tile<BC, D, THREADS>(sK, K + off_kv, k0, NK);
        load_tile<BC, D, THREADS>(sV, V + off_kv, k0, NK);
        if (i0 < nqb) load_q(i0, 0);
        cp_async_commit();
        for (int i = i0; i < nqb; ++i) {
            const int buf = (i - i0) & 1;
            if (i + 1 < nqb) {
                load_q(i + 1, buf ^ 1);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            {  // D_i: THREADS / BR threads a row, each a slice of head_dim
                constexpr int TPR = THREADS / BR, COLS = D / TPR;
                static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "threads a row: a power of 2");
                const int r = threadIdx.x / TPR, c0 = (threadIdx.x % TPR) * COLS;
                const u16* a = sdO + buf * BR * D;
                const u16* o = sO + buf * BR * D;
                float acc = 0.f;
#pragma unroll
                for (int c = 0; c < COLS; c += 8) {
                    const int e = swz<D>(r, (c0 + c) >> 3);
#pragma unroll
                    for (int x = 0; x < 8; ++x) acc += to_float<BF16>(a[e + x]) * to_float<BF16>(o[e + x]);
                }
#pragma unroll
                for (int s = TPR / 2; s; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
                if (threadIdx.x % TPR == 0) sD[buf * BR + r] = acc;
            }
            __syncthreads();
            w.step(sK, sV, sQ + buf * BR * D, sdO + buf * BR * D, sL + buf * BR, sD + buf * BR, sdS, i * BR, k0, NQ,
                   NK, off, causal, scale_log2);
            __syncthreads();
            dq_update<D, BR, WARPS, BF16, false>(sdS, sK, dq, i * BR, NQ);
        }
        cp_async_wait<0>();
        w.store(dK + off_kv, dV + off_kv, k0, NK, scale);
        __syncthreads();  // K and V are refilled for the next key tile
    }
}

// ---- the rows around the main kernels -----------------------------------------------------------------------

// flash2's first kernel: D = rowsum(dO * O) in fp32 and the row's fp32 dQ accumulator zeroed; D / 8 threads a row
template <int D, int THREADS, bool BF16>
__global__ void __launch_bounds__(THREADS) bwd_dot(const u16* __restrict__ dO, const u16* __restrict__ O,
                                                   float* __restrict__ Dsum, float* __restrict__ dQacc, long long rows) {
    constexpr int TPR = D / 8, RPB = THREADS / TPR;
    static_assert(TPR <= 32 && THREADS % TPR == 0, "a row's threads within one warp");
    const long long row = (long long)blockIdx.x * RPB + threadIdx.x / TPR;
    const int c = (threadIdx.x % TPR) * 8;
    float s = 0.f;
    if (row < rows) {
        const uint4 x = *(const uint4*)(dO + row * D + c), y = *(const uint4*)(O + row * D + c);
        const u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            s += to_float<BF16>((u16)(xs[i] & 0xffffu)) * to_float<BF16>((u16)(ys[i] & 0xffffu)) +
                 to_float<BF16>((u16)(xs[i] >> 16)) * to_float<BF16>((u16)(ys[i] >> 16));
        float4* z = (float4*)(dQacc + row * D + c);
        z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int o = TPR / 2; o; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (row < rows && threadIdx.x % TPR == 0) Dsum[row] = s;
}

// the last kernel: dQ = scale * dQacc in the input dtype, 8 elements a thread
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_convert(const float* __restrict__ dQacc, u16* __restrict__ dQ,
                                                   long long n8, float scale) {
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= n8) return;
    const float4 a = ((const float4*)dQacc)[2 * i], b = ((const float4*)dQacc)[2 * i + 1];
    ((uint4*)dQ)[i] = make_uint4(pack2<BF16>(a.x * scale, a.y * scale), pack2<BF16>(a.z * scale, a.w * scale),
                                 pack2<BF16>(b.x * scale, b.y * scale), pack2<BF16>(b.z * scale, b.w * scale));
}

// naive attention's softmax gradient: dS = scale * P * (dP - rowsum(P * dP)), one block per row. The row's P and
// dP are read once, 16 bytes a load (32 bytes a thread in flight), kept in shared memory, and dS written once.
// A row need not start on a 16-byte boundary (odd N): vectors are aligned to the tensor, and the row's first and
// last ones, partly another row's, go element by element; so does every element when P, dP and dS are misaligned
// to one another.
template <bool BF16>
DEVI void bwd_pairs(const u16* __restrict__ p, const u16* __restrict__ dp, int c0, int NK, bool whole,
                    uint4& x, uint4& y) {
    if (whole) {
        x = __ldg((const uint4*)(p + c0));
        y = __ldg((const uint4*)(dp + c0));
        return;
    }
    u16 a[8], b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const bool in = c0 + i >= 0 && c0 + i < NK;
        a[i] = in ? p[c0 + i] : (u16)0;
        b[i] = in ? dp[c0 + i] : (u16)0;
    }
    x = make_uint4(a[0] | (u32)a[1] << 16, a[2] | (u32)a[3] << 16, a[4] | (u32)a[5] << 16, a[6] | (u32)a[7] << 16);
    y = make_uint4(b[0] | (u32)b[1] << 16, b[2] | (u32)b[3] << 16, b[4] | (u32)b[5] << 16, b[6] | (u32)b[7] << 16);
}

template <bool BF16>
DEVI float dot8(const uint4& x, const uint4& y) {
    const u32 a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        s += to_float<BF16>((u16)(a[i] & 0xffffu)) * to_float<BF16>((u16)(b[i] & 0xffffu)) +
             to_float<BF16>((u16)(a[i] >> 16)) * to_float<BF16>((u16)(b[i] >> 16));
    return s;
}

template <int THREADS, bool BF16>
__global__ void __launch_bounds__(THREADS) softmax_bwd_rows(const u16* __restrict__ P, const u16* __restrict__ dP,
                                                            u16* __restrict__ dS, int NK, float scale) {
    extern __shared__ uint4 row_vectors[];   // the row's P vectors, then its dP vectors
    __shared__ float red[THREADS / 32];
    const size_t r = blockIdx.x;
    const u16* p = P + r * NK;
    const u16* dp = dP + r * NK;
    u16* ds = dS + r * NK;
    const size_t at = (size_t)p;
    const bool aligned = (((at ^ (size_t)dp) | (at ^ (size_t)ds)) & 15) == 0;
    const int lead = aligned ? (int)((at >> 1) & 7) : 0;   // elements p sits past a 16-byte boundary
    const int nv = (lead + NK + 7) >> 3;                      // the vectors the row touches
    uint4* sp = row_vectors;
    uint4* sdp = row_vectors + nv;
    float sum = 0.f;
#pragma unroll 2
    for (int v = threadIdx.x; v < nv; v += THREADS) {
        const int c = 8 * v - lead;
        uint4 x, y;
        bwd_pairs<BF16>(p, dp, c, NK, aligned && c >= 0 && c + 8 <= NK, x, y);
        sp[v] = x;
        sdp[v] = y;
        sum += dot8<BF16>(x, y);
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    sum = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) sum += red[w];
    for (int v = threadIdx.x; v < nv; v += THREADS) {   // each thread reads back the vectors it wrote
        const uint4 x = sp[v], y = sdp[v];
        const u32 a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
        u32 o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            o[i] = pack2<BF16>(
                scale * to_float<BF16>((u16)(a[i] & 0xffffu)) * (to_float<BF16>((u16)(b[i] & 0xffffu)) - sum),
                scale * to_float<BF16>((u16)(a[i] >> 16)) * (to_float<BF16>((u16)(b[i] >> 16)) - sum));
        const int c = 8 * v - lead;
        if (aligned && c >= 0 && c + 8 <= NK) {
            *(uint4*)(ds + c) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (c + i >= 0 && c + i < NK) ds[c + i] = (u16)((o[i / 2] >> (16 * (i % 2))) & 0xffffu);
        }
    }
}

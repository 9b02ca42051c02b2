"""`iosim explain`: the report's reasoning in words, for one configuration and profile."""
from __future__ import annotations

from ..analytic import analyze
from ..engine import simulate
from ..hardware import HardwareProfile
from ..plan import Tiling, flash3
from ..workload import AttentionConfig


def _gb(b: float) -> str:
    return f"{b / 1e9:,.2f} GB"


def recompute_lines(cfg: AttentionConfig, hw: HardwareProfile, tiling: Tiling | None, naive, flash) -> list[str]:
    """What the tiled backward's recomputation buys: the bytes it does not move against the FLOPs it adds."""
    a = analyze(cfg, "flash2", hw, tiling)
    added = a.recompute_flops
    saved = naive.hbm_bytes - flash.hbm_bytes
    t_flops = added / hw.tensor_flops_per_s(cfg.dtype)
    t_bytes = saved / hw.hbm_bytes_per_s
    return [f"Recompute, don't store: the tiled backward rebuilds S and P from Q, K and the saved log-sum-exp "
            f"({added / 1e9:,.1f} GFLOP more matmul, {t_flops * 1e3:,.3f} ms at the tensor cores' peak) instead of "
            f"reading P back ({_gb(saved)} fewer HBM bytes in all, {t_bytes * 1e3:,.3f} ms at HBM's peak): "
            f"{t_bytes / t_flops:,.0f}x more time saved than spent."]


def exp_roof(cfg: AttentionConfig, hw: HardwareProfile) -> float:
    """The matmul FLOP/s at which the exp unit is as busy as the tensor cores: each score costs 4 d matmul FLOPs
    (its share of QKᵀ and of PV) and one exp."""
    return hw.exp_per_s * 4 * cfg.head_dim


def generations_lines(cfg: AttentionConfig, hw: HardwareProfile) -> list[str]:
    """flash1, flash2 and flash3 side by side at the chip's peak rates, and why the asynchronous one wins."""
    if not flash3.runs_on(cfg, hw):
        return []
    lines = ["", "Three generations of the tiled kernel on this chip (engine, peak rates):"]
    for alg in ("flash1", "flash2", "flash3"):
        r = simulate(cfg, alg, hw)
        k = r.kernels[0]
        lines.append(f"  {alg:<7} {r.time_s * 1e6:9.1f} µs  {r.mma_flops / r.time_s / 1e12:7.1f} TFLOP/s  "
                     f"bound: {k.bound} (compute {k.utilisation['compute']:.0%} busy)")
    wg, mma, roof = hw.tensor_flops_per_s(cfg.dtype, wgmma=True), hw.tensor_flops_per_s(cfg.dtype), exp_roof(cfg, hw)
    lines.append(
        f"Why the asynchronous one wins: the tensor cores do {wg / 1e12:,.0f} TFLOP/s with wgmma ({mma / 1e12:,.0f} "
        f"with mma.sync) and the exp unit {hw.exp_per_s / 1e12:,.2f} T exp/s. At d = {cfg.head_dim} a score costs "
        f"{4 * cfg.head_dim} matmul FLOPs and one exp, so the exps alone hold the matmuls to {roof / 1e12:,.0f} "
        f"TFLOP/s. One after the other (flash1, flash2: a warp's softmax waits for its matmul) the two times add: at "
        f"most {1 / (1 / wg + 1 / roof) / 1e12:,.0f} TFLOP/s. FlashAttention-3's design runs one warpgroup's "
        f"softmax under the other's wgmma (ping-pong), so that only the slower of the two would count: "
        f"{min(wg, roof) / 1e12:,.0f} TFLOP/s. Measured on an H100, a key tile of iosim's flash3 and of cuDNN's "
        f"forward still takes its tensor cycles plus its other instructions' cycles (docs/decisions.md, 2026-12-07), "
        f"and the engine adds them too: what flash3 gains is wgmma's rate, tiles that arrive by TMA, which holds no "
        f"warp, and operands wgmma reads from shared memory once per warpgroup, not once per warp.")
    return lines


def explain(cfg: AttentionConfig, hw: HardwareProfile, tiling: Tiling | None = None) -> str:
    naive, flash = simulate(cfg, "naive", hw), simulate(cfg, "flash2", hw, tiling)
    tb = cfg.tensor_bytes()
    lines = [f"{cfg.label()} on {hw.name}.", ""]
    lines.append(f"Naive attention writes S = QKᵀ ({_gb(tb['S'])}) to HBM, reads it back for the softmax, writes P "
                 f"({_gb(tb['P'])}) and reads it again for PV: {_gb(naive.hbm_bytes)} of HBM traffic in all, "
                 f"against {_gb(tb['Q'] + tb['K'] + tb['V'] + tb['O'])} for reading Q, K, V and writing O once.")
    for k in naive.kernels:
        lines.append(f"  {k.name:<14} {k.time_s * 1e6:9.1f} µs  HBM {_gb(k.hbm_read_bytes + k.hbm_write_bytes):>10}"
                     f"  bound: {k.bound} (HBM {k.utilisation['hbm']:.0%} busy, compute {k.utilisation['compute']:.0%})")
    k = flash.kernels[0]
    lines += ["", f"Tiled attention (flash2) keeps S and P in SRAM: {_gb(flash.hbm_bytes)} of HBM traffic, "
              f"{_gb(flash.l2_bytes)} through L2 (each K/V tile is re-read by every query block of its head; "
              f"L2 serves those re-reads).",
              f"  {k.name:<14} {k.time_s * 1e6:9.1f} µs  bound: {k.bound} (compute {k.utilisation['compute']:.0%}, "
              f"HBM {k.utilisation['hbm']:.0%}, L2 {k.utilisation.get('l2', 0):.0%} busy); "
              f"{k.blocks:,} blocks, {k.blocks_per_sm} per SM, {k.waves:.2f} waves",
              "", f"Predicted speed-up {naive.time_s / flash.time_s:.2f}x with {naive.mma_flops / flash.mma_flops:.2f}x "
              f"the matmul FLOPs: tiling wins by moving {naive.hbm_bytes / flash.hbm_bytes:.1f}x fewer HBM bytes.",
              "", "What would change the answer:"]
    if k.bound == "compute":
        lines.append("  - the tiled kernel is compute-bound: a faster matmul (wgmma instead of mma.sync), or overlapping "
                     "softmax with the matmuls (FlashAttention-3), would help it; more HBM bandwidth would not.")
    else:
        lines.append(f"  - the tiled kernel is {k.bound}-bound: larger tiles (more SRAM) or more bandwidth would help.")
    lines.append("  - naive attention is memory-bound: its time follows HBM bandwidth and the N² bytes of S and P; "
                 "at short N, S may fit in L2 and the gap narrows.")
    lines.append(f"  - peak HBM footprint: naive {_gb(naive.peak_footprint_bytes)}, tiled {_gb(flash.peak_footprint_bytes)}"
                 f" (HBM {hw.hbm_capacity_gb:g} GB).")
    if "backward" in cfg.passes:
        lines += [""] + recompute_lines(cfg, hw, tiling, naive, flash)
    lines += generations_lines(cfg, hw)
    return "\n".join(lines)

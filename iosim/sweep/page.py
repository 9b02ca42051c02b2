"""A sweep's page (plotly): time per algorithm and, where naive attention is in the sweep, each tiled algorithm's
speed-up over it, against the dimension the sweep varies most (a what-if field, N, batch, ...)."""
from __future__ import annotations

import json
from pathlib import Path

AXES = ("seqlen_q", "seqlen_k", "batch", "heads", "head_dim", "kv_heads")


def _what_if_columns(df) -> list[str]:
    """The what-if fields as columns of their own (value or factor), one per field the sweep varies."""
    fields: dict[str, list] = {}
    for w in df["what_if"].unique():
        for k, (how, v) in json.loads(w).items():
            fields.setdefault(f"{k}{' x' if how == 'scale' else ''}", []).append(v)
    return [k for k, v in fields.items() if len(set(v)) > 1]


def write_page(df, path: Path) -> None:
    import plotly.express as px
    ok = df[df["error"].isna()].copy()
    for col in _what_if_columns(df):
        field = col.removesuffix(" x")
        ok[col] = [json.loads(w).get(field, (None, None))[1] for w in ok["what_if"]]
    varying = [c for c in _what_if_columns(df) + list(AXES) if c in ok and ok[c].nunique() > 1]
    x = varying[0] if varying else "layer"
    rest = [c for c in varying[1:]] + ["profile", "layer", "pass", "dtype", "causal"]
    ok["series"] = ok[[c for c in rest if ok[c].nunique() > 1]].astype(str).agg(" ".join, axis=1) \
        if any(ok[c].nunique() > 1 for c in rest) else ""
    figs = []
    t = ok.assign(time_ms=ok["time_s"] * 1e3)
    fig = px.line(t.sort_values(x), x=x, y="time_ms", color="algorithm", line_dash="series", markers=True,
                  log_y=True, title="Predicted time per algorithm", labels={"time_ms": "time (ms)"})
    figs.append(fig)
    if "naive" in set(ok["algorithm"]) and len(set(ok["algorithm"])) > 1:
        keys = [c for c in ok.columns if c not in ("point_id", "algorithm", "time_s", "hbm_bytes", "hbm_read_bytes",
                                                  "hbm_write_bytes", "l2_bytes", "matmul_flops", "exp_ops", "bound",
                                                  "scaled", "predict_s", "cublas_align1", "error")]
        naive = ok[ok["algorithm"] == "naive"].set_index(keys)["time_s"]
        tiled = ok[ok["algorithm"] != "naive"].set_index(keys)
        tiled = tiled.assign(speedup=naive.reindex(tiled.index).to_numpy() / tiled["time_s"].to_numpy()).reset_index()
        figs.append(px.line(tiled.sort_values(x), x=x, y="speedup", color="algorithm", line_dash="series",
                            markers=True, title="Speed-up over naive attention (predicted time)",
                            labels={"speedup": "naive time / tiled time"}))
    n_err = int(df["error"].notna().sum())
    head = (f"<h1>iosim sweep</h1><p>{len(df)} points, {len(ok)} predicted, {n_err} refused by their plan "
            f"(their reasons are in results.csv); {int(ok['scaled'].fillna(False).sum())} scaled down "
            "(docs/model.md, bounded cost)"
            + (f"; {int(ok['cublas_align1'].fillna(False).sum())} naive or eager points at sequence lengths whose "
               "rows are not 16-byte aligned, where cuBLAS runs alignment-1 GEMMs, here at the chip's peak rates "
               "(no fitted traits): predicted fast (experiments/cublas_alignment)"
               if ok["cublas_align1"].fillna(False).any() else "")
            + ".</p>")
    body = "".join(f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs))
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>iosim sweep</title></head>"
                    f"<body>{head}{body}</body></html>")

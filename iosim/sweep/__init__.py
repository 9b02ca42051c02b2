"""Many predictions at once: a spec's points (`spec`) predicted on workers (`workers`), kept as they finish.

`run_sweep(spec, out)` predicts every point of the spec not already in `out/parts/`, writing each finished batch
there as a Parquet part at once, so a sweep killed part-way keeps what it finished and picks up from there when
run again. At the end the points of the spec are gathered into `out/results.parquet` and `out/results.csv`, and
`out/sweep.html` plots them (`page`). The result is a pandas DataFrame, a row a point.
"""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from ..errors import IosimError
from .spec import SweepSpec, load_spec, parse_spec, points
from .workers import Workers

__all__ = ["SweepSpec", "Workers", "load_spec", "parse_spec", "points", "run_sweep"]

# a worker's task: this many points (enough to outweigh a task's overhead, few enough to spread and to show)
CHUNK = 8
# finished rows are written out at least this often
FLUSH_S = 5.0


def _predict(chunk: list[dict], profiles: dict) -> list[dict]:
    """The rows of a chunk of points (run on a worker): a point a plan refuses gets its one-line reason."""
    from ..engine import simulate
    from ..kernels.cublas import meets_align1
    rows = []
    for p in chunk:
        cfg = p["config"]
        row = {"point_id": p["point_id"], "profile": p["profile"], "what_if": p["what_if"], "layer": p["layer"],
               **{k: getattr(cfg, k) for k in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim",
                                               "dtype", "causal")},
               "pass": cfg.pass_, "algorithm": p["algorithm"]}
        t = time.perf_counter()
        try:
            r = simulate(cfg, p["algorithm"], profiles[(p["profile"], p["what_if"])])
        except IosimError as e:
            rows.append(row | {"error": str(e)})
            continue
        rows.append(row | {"time_s": r.time_s, "hbm_bytes": r.hbm_bytes, "hbm_read_bytes": r.hbm_read_bytes,
                           "hbm_write_bytes": r.hbm_write_bytes, "l2_bytes": r.l2_bytes,
                           "matmul_flops": r.mma_flops, "exp_ops": r.exp_ops, "bound": r.bound,
                           "scaled": r.scaled is not None, "predict_s": time.perf_counter() - t,
                           "cublas_align1": meets_align1(p["algorithm"], cfg),
                           "error": None})
    return rows


def _frame(rows: list[dict]):
    import pandas as pd
    cols = ["point_id", "profile", "what_if", "layer", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k",
            "head_dim", "dtype", "causal", "pass", "algorithm", "time_s", "hbm_bytes", "hbm_read_bytes",
            "hbm_write_bytes", "l2_bytes", "matmul_flops", "exp_ops", "bound", "scaled", "predict_s", "cublas_align1",
            "error"]
    df = pd.DataFrame(rows, columns=cols)
    for c in ("time_s", "predict_s"):
        df[c] = df[c].astype("float64")
    for c in ("hbm_bytes", "hbm_read_bytes", "hbm_write_bytes", "l2_bytes", "matmul_flops", "exp_ops"):
        df[c] = df[c].astype("Float64")   # exact up to 2^53, nullable for refused points
    df["scaled"] = df["scaled"].astype("boolean")
    df["cublas_align1"] = df["cublas_align1"].astype("boolean")
    return _errors(df)


def _errors(df):
    """The reasons of refused points as objects, None where predicted (however the rows were gathered)."""
    df["error"] = df["error"].astype(object).where(df["error"].notna(), None)
    return df


def _write_part(parts: Path, rows: list[dict]) -> None:
    """One batch of rows as a Parquet part, written whole or not at all (a kill leaves no half file)."""
    name = f"part-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = parts / f".{name}.tmp"
    _frame(rows).to_parquet(tmp, index=False)
    tmp.rename(parts / name)


def _done(parts: Path):
    import pandas as pd
    files = sorted(parts.glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else _frame([])


def _prepare(out: Path, spec: SweepSpec, force: bool) -> Path:
    """out/ for this spec: new, or holding this spec's finished points (kept); another spec's is refused unless
    `force` starts it over."""
    text = json.dumps(spec.model_dump(), sort_keys=True, indent=1)
    parts = out / "parts"
    saved = out / "spec.json"
    if saved.exists() and saved.read_text() != text:
        if not force:
            raise IosimError(f"{out} holds a sweep of another spec ({saved}); give another --out, or --force to "
                             "start that folder over")
        for f in parts.glob("part-*.parquet"):
            f.unlink()
    elif out.exists() and not saved.exists() and any(out.iterdir()) and not force:
        raise IosimError(f"{out} exists and is not a sweep's folder; give another --out, or --force")
    parts.mkdir(parents=True, exist_ok=True)
    saved.write_text(text)
    return parts


def run_sweep(spec: SweepSpec, out: str | Path | None = None, *, scheduler: str | None = None,
              workers: int | None = None, progress: bool = True, force: bool = False, page: bool = True):
    """Predict every point of `spec`; with `out`, keep finished points there and resume from them. Returns a
    DataFrame, a row a point in the spec's order (refused points carry their reason in `error`)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn
    pts = points(spec)
    parts = _prepare(Path(out), spec, force) if out is not None else None
    have = _done(parts) if parts is not None else _frame([])
    seen = set(have["point_id"])
    todo = [p for p in pts if p["point_id"] not in seen]
    profiles = {(p["profile"], p["what_if"]): p["hw"] for p in pts}
    chunks = [[{k: v for k, v in p.items() if k != "hw"} for p in todo[i:i + CHUNK]]
              for i in range(0, len(todo), CHUNK)]
    rows: list[dict] = []
    pending: list[dict] = []
    last = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True, disable=not progress) as bar:
        task = bar.add_task("sweep", total=len(pts), completed=len(pts) - len(todo))
        try:
            if chunks:
                with Workers(scheduler, workers) as w:
                    for _, result in w.map(_predict, chunks, profiles):
                        rows += result
                        pending += result
                        bar.advance(task, len(result))
                        if parts is not None and time.monotonic() - last > FLUSH_S:
                            _write_part(parts, pending)
                            pending, last = [], time.monotonic()
        finally:
            if parts is not None and pending:
                _write_part(parts, pending)
    import pandas as pd
    new = _frame(rows)
    df = pd.concat([x for x in (have, new) if len(x)], ignore_index=True) if len(have) or len(new) else new
    order = {p["point_id"]: i for i, p in enumerate(pts)}
    df = df[df["point_id"].isin(order)].drop_duplicates("point_id")
    df = _errors(df.iloc[df["point_id"].map(order).argsort()].reset_index(drop=True))
    if out is not None:
        out = Path(out)
        df.to_parquet(out / "results.parquet", index=False)
        df.to_csv(out / "results.csv", index=False)
        if page:
            from .page import write_page
            write_page(df, out / "sweep.html")
    return df

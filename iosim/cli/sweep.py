"""`iosim sweep SPEC`: many predictions from a TOML spec, on local workers or a Dask cluster."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .console import out


def example_spec() -> str:
    return (resources.files("iosim.sweep") / "example.toml").read_text()


def cmd_sweep(args) -> None:
    from ..errors import IosimError
    from ..sweep import load_spec, run_sweep
    if args.example:
        print(example_spec(), end="")
        return
    if not args.spec:
        raise IosimError("sweep needs a spec file (iosim sweep --example prints one)")
    spec = load_spec(args.spec)
    folder = Path(args.out) if args.out else Path("sweeps") / Path(args.spec).stem
    df = run_sweep(spec, folder, scheduler=args.scheduler, workers=args.workers, force=args.force)
    ok = df[df["error"].isna()]
    out.print(f"{len(df)} points ({len(ok)} predicted, {len(df) - len(ok)} refused by their plan, "
              f"{int(ok['scaled'].fillna(False).sum())} scaled down) in {folder}: results.parquet, results.csv, "
              "sweep.html")

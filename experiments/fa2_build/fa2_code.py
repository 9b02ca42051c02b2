"""The machine code of PyTorch's flash kernels for sm_90: bytes of each kernel's .text section in the cubins that
torch's CUDA library carries, read with cuobjdump. What the engine needs to count the code those kernels read
through a cold L2 and to time a first wave's fetch of it (`Traits.code_bytes`), as it does for our kernels from
nvcc's builds (iosim/kernels/builds.py).

    source .whl/prelude.sh && python3 experiments/fa2_build/fa2_code.py --out $OUT/fa2_code.json   # on the GPU machine
    python3 experiments/fa2_build/fa2_code.py --print FILE                                          # the table, anywhere

The JSON holds every flash kernel instance found (mangled name, demangled name with its bool arguments as 0 / 1
as Nsight Compute prints them, bytes) with the provenance of the library it came from; `iosim.kernels.builds.fa2_key`
reads either spelling.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from iosim.kernels.builds import ncu_spelling, text_sections  # noqa: E402


def scan(lib: Path, arch: str = "sm_90") -> list[dict]:
    """Every flash kernel instance of `arch` in `lib`: mangled name, Nsight's name, .text bytes, cubin."""
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        # extracts the cubins whose names hold the arch (one a translation unit), each as a file
        subprocess.run(["cuobjdump", "-xelf", arch, str(lib.resolve())], cwd=tmp, check=True, capture_output=True)
        for cubin in sorted(Path(tmp).iterdir()):
            for name, size in text_sections(cubin.read_bytes()).items():
                if "flash_fwd" in name:
                    found.append({"mangled": name, "bytes": size, "cubin": cubin.name})
    filt = shutil.which("cu++filt") or shutil.which("c++filt")   # binutils' demangles these names too
    if found and filt:
        out = subprocess.run([filt], input="\n".join(f["mangled"] for f in found), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        for f, d in zip(found, out):
            f["name"] = ncu_spelling(d.strip())
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (on the GPU machine)")
    ap.add_argument("--print", type=Path, dest="show", help="print the table of a stored JSON")
    args = ap.parse_args()
    if args.show:
        data = json.loads(args.show.read_text())
        for k in sorted(data["kernels"], key=lambda k: k["name"]):
            print(f"{k['bytes']:>8,}  {k['name'][:150]}")
        return
    import torch
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    kernels = scan(lib)
    tool = subprocess.run(["cuobjdump", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    data = {"library": str(lib), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuobjdump": tool[-1] if tool else None, "arch": "sm_90",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "method": "cuobjdump -xelf sm_90 libtorch_cuda.so; each cubin's .text.<kernel> section size",
            "kernels": kernels}
    if args.out:
        args.out.write_text(json.dumps(data, indent=1))
    print(f"{len(kernels)} flash kernel instances for sm_90 in {lib}")


if __name__ == "__main__":
    main()

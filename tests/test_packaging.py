"""What a user installs: the wheel carries iosim with its profiles and tables, and gpu_kernels with its CUDA source."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_carries_the_kernels_their_source_and_the_profiles(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    names = set(zipfile.ZipFile(next(tmp_path.glob("iosim-*.whl"))).namelist())
    assert {"gpu_kernels/attention.cu", "gpu_kernels/backward.cu", "gpu_kernels/ops.py", "gpu_kernels/backward.py",
            "gpu_kernels/autograd.py", "gpu_kernels/measure.py"} <= names
    assert {"iosim/hw_profiles/h200_sxm.calibrated.toml", "iosim/hw_profiles/h200_sxm.calibrated.kernels.json",
            "iosim/kernels/builds_sm90.json", "iosim/kernels/pipes_sm90.json",
            "iosim/kernels/torch_fa2_code_sm90.json"} <= names
    assert not any(n.startswith(("experiments/", "tests/", "reports/")) for n in names)

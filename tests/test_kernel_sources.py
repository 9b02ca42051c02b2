"""Every CUDA source compiles with nvcc for sm_80 and sm_90 (no GPU needed), without local-memory spills in
the kernels that are meant to have none. The quick suite compiles a sample of the instances (`build.sample_names`:
every kernel, head dim and dtype), the slow one every instance."""
import re
import shutil
import subprocess

import pytest

from gpu_kernels import build

nvcc = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(nvcc is None, reason="nvcc is not installed")


@pytest.fixture(scope="module", params=["sample", pytest.param("all", marks=pytest.mark.slow)])
def build_dir(request, tmp_path_factory):
    """The sample's (or every) instance compiled to a cubin for sm_80 and one for sm_90, with ptxas's report of
    both and the names compiled."""
    d = tmp_path_factory.mktemp("nvcc")
    names = build.sample_names() if request.param == "sample" else build.all_names()
    (d / "names.txt").write_text("\n".join(names))
    src = d / "all.cu"
    src.write_text(build.nvcc_source(names))
    # the two architectures compile at once, one a core
    procs = [subprocess.Popen([nvcc, "-std=c++17", f"-arch={arch}", "-cubin", str(src), "-o", str(d / f"{arch}.cubin"),
                               "-Xptxas", "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for arch in ("sm_80", "sm_90")]
    report = ""
    for proc in procs:
        _, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        report += err
    (d / "report.txt").write_text(report)
    return d


@pytest.fixture(scope="module")
def ptxas_report(build_dir):
    return (build_dir / "report.txt").read_text()


def entries(report: str) -> dict[tuple[str, str], str]:
    """(kernel signature, arch) -> the resource lines ptxas printed for it."""
    res, cur = {}, None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'", line)
        if m:
            cur = (m.group(1), m.group(2))
            res[cur] = ""
        elif cur:
            res[cur] += line + "\n"
    return res


def test_every_instance_compiles_for_sm80_and_sm90(build_dir, ptxas_report):
    e = entries(ptxas_report)
    n = len((build_dir / "names.txt").read_text().splitlines())
    assert sum(1 for (_, arch) in e if arch == "sm_80") == n
    assert sum(1 for (_, arch) in e if arch == "sm_90") == n


def test_kernels_fit_the_register_file_and_small_tiles_do_not_spill(ptxas_report):
    for (name, arch), text in entries(ptxas_report).items():
        regs = int(re.search(r"Used (\d+) registers", text).group(1))
        assert regs <= 255
        spill = int(re.search(r"(\d+) bytes spill stores", text).group(1))
        # 16 query rows a warp (MT = 1) at d <= 128: no spills with double buffering, a few bytes at most without
        m = re.match(r"_Z10flash[12]_fwdILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", name)
        if m:
            d, bq, _, warps, stages = map(int, m.groups())
            if d <= 128 and bq == 16 * warps:
                assert spill <= (0 if stages == 2 else 16), (name, arch, text)


def test_the_engines_table_is_what_nvcc_builds_for_sm90(build_dir, ptxas_report):
    # validate gives the engine each measured kernel's register count (occupancy) and code bytes (read through a
    # cold L2) from this table
    from iosim.kernels.builds import _table, table
    fresh = table(ptxas_report, (build_dir / "sm_90.cubin").read_bytes())
    names = (build_dir / "names.txt").read_text().splitlines()
    assert len(fresh) == len(names)
    shipped = _table()
    assert {k: shipped.get(k) for k in fresh} == fresh
    if len(names) == len(build.all_names()):
        assert fresh == shipped
    # a kernel's code grows with what it unrolls: FlashAttention-2's 128x128 tile at d 64 is more than twice 64x64's
    code = {k: v["code_bytes"] for k, v in fresh.items()}
    assert code["flash2 d64 128x128 4w 2st fp16"] > 2 * code["flash2 d64 64x64 4w 2st fp16"]


@pytest.mark.parametrize("where", ["gpu_kernels.calibrate", "experiments/l2_capacity/l2_probe.py", "experiments/hbm_rates/hbm_mix.py",
                                   "experiments/hbm_rates/hbm_tiles.py", "experiments/cold_start/cold_burst.py",
                                   "experiments/store_issue/store_issue.py"])
def test_microbenchmark_sources_compile_for_sm90(where, tmp_path):
    # their CUDA is compiled by NVRTC on the GPU machine: a typo found here costs no device time
    import importlib
    import importlib.util
    from pathlib import Path
    if where.endswith(".py"):
        path = Path(__file__).resolve().parent.parent / where
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    src = mod.SRC + "".join(f"\ntemplate __global__ void mma_loop<{b}>(int, float*);" for b in ("false", "true")
                            if "mma_loop" in mod.SRC)
    if "store_tile" in mod.SRC:   # templates: every instance the benchmark runs
        src += "".join(f"\ntemplate __global__ void store_tile<{p}, {r}, {d}>(unsigned char*, float, unsigned long long*);"
                       for p in range(len(mod.PATTERNS)) for r, d in mod.TILES)
    (tmp_path / "k.cu").write_text(src)
    out = subprocess.run([nvcc, "-arch=sm_90", "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_block_trace_build_compiles_and_leaves_the_kernels_alone(tmp_path):
    # experiments/block_placement/block_trace.py builds attention.cu with IOSIM_TRACE; without it no trace code is compiled
    src = tmp_path / "t.cu"
    names = [build.flash_name(o, 64, 128, 128, 4, 2, False) for o in ("flash1", "flash2")]
    src.write_text("\n".join(line for line in build.nvcc_source().splitlines()
                             if not line.startswith("template __global__") or any(n in line for n in names)))
    ptx = {}
    for define in ("", "-DIOSIM_TRACE=4096"):
        out = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "--ptx", *filter(None, [define]), str(src), "-o",
                              str(tmp_path / "t.ptx")], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        ptx[define] = (tmp_path / "t.ptx").read_text()
    assert "%globaltimer" in ptx["-DIOSIM_TRACE=4096"] and "iosim_trace" in ptx["-DIOSIM_TRACE=4096"]
    assert "%globaltimer" not in ptx[""] and "iosim_trace" not in ptx[""]


def test_flash3_compiles_for_sm90a_and_spills_only_with_three_consumers(tmp_path):
    """flash3's wgmma, setmaxnreg and TMA need sm_90a; each instance takes the launch registers iosim plans it with
    (`plan.flash3.launch_registers` of its threads). Two consumers (240 registers each after setmaxnreg) spill
    nothing; three (160 each, d 64's 192-row block) spill at most 176 bytes a thread, the build measured faster
    all the same (experiments/flash3_blocks, experiments/flash3_persistent)."""
    from iosim.plan.flash3 import launch_registers
    names = build.flash3_names()
    src = tmp_path / "f3.cu"
    src.write_text(build.hopper_source(names))
    out = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", "-cubin", str(src), "-o", str(tmp_path / "f3.cubin"),
                          "-Xptxas", "-v"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    e = {k: v for k, v in entries(out.stderr).items() if k[0].startswith("_Z10flash3_fwd")}
    assert len(e) == len(names)
    for (name, arch), text in e.items():
        assert arch == "sm_90a"
        consumers = int(re.match(r"_Z10flash3_fwdILi\d+ELi\d+ELi\d+ELi(\d+)E", name).group(1))
        spilled = int(re.search(r"(\d+) bytes spill stores", text).group(1))
        assert spilled == 0 if consumers == 2 else spilled <= 176, (name, text)
        assert int(re.search(r"Used (\d+) registers", text).group(1)) == launch_registers(128 * (consumers + 1))


def test_flash3_plan_has_the_kernels_shared_memory(tmp_path):
    """iosim's flash3 plan counts the bytes hopper.cu's Flash3Smem lays out (the launcher asks for the plan's)."""
    from iosim.plan.flash3 import GEOMETRIES, STAGES, smem_bytes
    from iosim.workload import AttentionConfig
    from gpu_kernels.hopper import HEAD_DIMS
    built = [(d, g) for d in HEAD_DIMS for g in GEOMETRIES[d]]
    main = "#include <cstdio>\nint main() {\n" + "".join(
        f'    std::printf("%u\\n", Flash3Smem<{d}, {64 * g[0]}, {g[1]}, {STAGES}>::BYTES);\n'
        for d, g in built) + "}\n"
    src = tmp_path / "smem.cu"
    src.write_text(build.hopper_source() + "\n" + main)
    exe = tmp_path / "smem"
    out = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == [smem_bytes(AttentionConfig.make(batch=1, heads=1, seqlen_q=256, head_dim=d, dtype="fp16"), g)
                   for d, g in built]


def test_the_flashattention2_warp_layout_runs_where_the_plan_says_and_holds_its_p_tile(monkeypatch):
    # one set says which head_dims run flash2_bwd_split, for the launcher's kernel name and the plan's shared memory
    from iosim.plan import backward
    from iosim.plan.backward import iosim_bwd_smem
    monkeypatch.setattr(backward, "SPLIT_LAYOUT", set())
    shipped, flash1 = iosim_bwd_smem("flash2", 128, 64, 128), iosim_bwd_smem("flash1", 128, 64, 128)
    assert build.bwd_name("flash2", 128, 64, 128, 8, True) == "flash2_bwd<128,64,64,8,true>"
    monkeypatch.setattr(backward, "SPLIT_LAYOUT", {128})
    assert build.bwd_name("flash2", 128, 64, 128, 8, True) == "flash2_bwd_split<128,64,8,true>"
    assert iosim_bwd_smem("flash2", 128, 64, 128) == shipped + 2 * 64 * 128   # P^T, 16-bit
    # only at 64x128 blocks, and never for flash1
    assert build.bwd_name("flash2", 128, 64, 64, 4, True).startswith("flash2_bwd<")
    assert build.bwd_name("flash1", 128, 64, 128, 8, True).startswith("flash1_bwd<")
    assert iosim_bwd_smem("flash1", 128, 64, 128) == flash1
    assert all(n in build.backward_names() for n in ("flash2_bwd_split<64,64,8,false>",
                                                     "flash2_bwd_split<128,64,8,true>"))

import re
from pathlib import Path

import pytest

from iosim.errors import IosimError
from iosim.hardware import HardwareProfile, list_profiles, load_profile, profiles_dir

BUILT_IN = ["a100_40gb", "a100_80gb", "h100_pcie", "h100_sxm", "h200_sxm", "h200_sxm.calibrated"]


def test_all_five_profiles_are_there_and_load():
    assert list_profiles() == BUILT_IN
    for key in BUILT_IN:
        p = load_profile(key)
        assert p.key == key
        # every quantity carries a source of a known kind
        for f in HardwareProfile.quantity_fields():
            if getattr(p, f) is not None:
                assert re.match(r"^(datasheet|whitepaper|guide|paper|measured|estimate):", p.sources[f]), (key, f)


def test_profiles_match_what_was_read_off_the_h200():
    p = load_profile("h200_sxm")
    assert (p.sm_count, p.l2_bytes, p.smem_per_sm_kib, p.smem_per_block_kib) == (132, 62_914_560, 228, 227)
    assert p.sources["sm_count"].startswith("measured: 2026-11-30")


def test_a100_sram_bandwidth_is_the_papers_19_tb_s():
    p = load_profile("a100_40gb")
    assert p.smem_bytes_per_s / 1e12 == pytest.approx(19.5, rel=0.01)
    assert p.tensor_fp8_tflops is None
    with pytest.raises(IosimError, match="no fp8 tensor cores"):
        p.tensor_flops_per_s("fp8")


def _write(tmp_path: Path, edit) -> Path:
    text = (profiles_dir() / "h100_sxm.toml").read_text()
    f = tmp_path / "mine.toml"
    f.write_text(edit(text))
    return f


def test_a_users_file_loads_by_path(tmp_path):
    f = _write(tmp_path, lambda t: t.replace('value = 3350', 'value = 6700'))
    p = load_profile(str(f))
    assert p.hbm_bandwidth_gb_s == 6700 and p.key == "mine"


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("value = 3350", "value = -5"), ["mine.toml", "hbm_bandwidth_gb_s", "-5", "greater than 0"]),
    (lambda t: t.replace("smem_per_block_kib = { value = 227", "smem_per_block_kib = { value = 300"),
     ["mine.toml", "smem_per_block_kib (300)", "smem_per_sm_kib (228)"]),
    (lambda t: t.replace('sm_count = { value = 132, source = "whitepaper: H100 SXM5 has 132 SMs" }',
                         'sm_count = 132'), ["mine.toml", "no source given for sm_count"]),
    (lambda t: t.replace('source = "datasheet: 3.35 TB/s"', 'source = "I think 3.35"'),
     ["mine.toml", "source of 'hbm_bandwidth_gb_s' must start with"]),
    (lambda t: t.replace('source = "datasheet: 3.35 TB/s"', 'source = "measured: with a copy"'),
     ["mine.toml", "must carry its date"]),
    (lambda t: t + '\nwarp_size = { value = 32, source = "guide: 32" }\n', ["mine.toml", "warp_size"]),
    (lambda t: t + "\nbroken = [\n", ["mine.toml", "not valid TOML"]),
    (lambda t: t.replace("value = 132,", "value = 0,"), ["mine.toml", "sm_count", "0"]),
    (lambda t: t.replace("l2_bandwidth_gb_s = { value = 10138", "l2_bandwidth_gb_s = { value = 100"),
     ["l2_bandwidth_gb_s (100) must be >= hbm_bandwidth_gb_s"]),
    (lambda t: t + '\nl2_dirty_mib = { value = 0, source = "guide: none" }\n', ["mine.toml", "l2_dirty_mib", "0",
                                                                             "greater than 0"]),
])
def test_a_bad_file_fails_with_one_line_naming_file_field_value_and_rule(tmp_path, edit, words):
    f = _write(tmp_path, edit)
    with pytest.raises(IosimError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_unknown_profile_and_missing_file():
    with pytest.raises(IosimError, match="unknown profile 'nope'.*h200_sxm"):
        load_profile("nope")
    with pytest.raises(IosimError, match="not found"):
        load_profile("/no/such/file.toml")


def test_what_if_variants_are_validated_and_say_what_changed():
    h100 = load_profile("h100_sxm")
    big = h100.scaled(smem_per_sm_kib=2, smem_per_block_kib=2)
    assert big.smem_per_sm_kib == 456 and big.smem_per_block_kib == 454
    assert big.sources["smem_per_sm_kib"].startswith("what-if: 456 instead of 228")
    assert h100.smem_per_sm_kib == 228  # the original is untouched
    assert h100.replace(l2_capacity_mib=0).l2_bytes == 0
    with pytest.raises(IosimError, match="smem_per_block_kib"):
        h100.scaled(smem_per_block_kib=3)           # per-block above per-SM
    with pytest.raises(IosimError, match="unknown profile field"):
        h100.replace(sram=1)

"""Where bf16 autocast is used: natively supported bf16 only, since emulated it is far slower."""

from __future__ import annotations

import torch

from gpu_trainer.precision import autocast_setting, bf16_is_native

CPU = torch.device("cpu")


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: some cpu\nflags\t\t: fpu sse2 avx2 {flags}\n\nprocessor\t: 1\n")
    return path


def test_a_cpu_is_native_only_with_amx_or_avx512_bf16(tmp_path):
    assert bf16_is_native(CPU, cpuinfo=_cpuinfo(tmp_path, "avx512f amx_tile amx_bf16"))
    assert bf16_is_native(CPU, cpuinfo=_cpuinfo(tmp_path, "avx512f avx512_bf16"))
    assert not bf16_is_native(CPU, cpuinfo=_cpuinfo(tmp_path, "avx512f avx512bw"))  # emulated there
    assert not bf16_is_native(CPU, cpuinfo=tmp_path / "absent")


def test_the_setting_is_explicit_or_follows_the_hardware():
    for on in (True, "1", "true", " On "):
        assert autocast_setting(on, CPU) is True
    for off in (False, "0", "false", "no"):
        assert autocast_setting(off, CPU) is False
    assert autocast_setting("auto", CPU) is bf16_is_native(CPU)
    assert autocast_setting(None, CPU) is bf16_is_native(CPU)

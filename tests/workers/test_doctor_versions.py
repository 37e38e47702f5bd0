"""The driver/CUDA check of `ddpviz doctor --gpu` and scripts/gpu_check.sh, with NVML and torch
stand-ins: versions as NVIDIA's release notes pair them (CUDA 13.x needs a driver >= 580, CUDA 12.x
>= 525; NVML's CUDA version int is 1000 * major + 10 * minor, nvml.h)."""

from types import SimpleNamespace

import pytest

from ddpviz.workers.doctor.versions import cuda_version_text, describe, mismatch, read_versions


def fake_nvml(driver="550.54.15", cuda=12040):
    return SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                           nvmlSystemGetDriverVersion=lambda: driver, nvmlSystemGetCudaDriverVersion=lambda: cuda)


def fake_torch(version="2.13.0", cuda="13.0", available=False):
    return SimpleNamespace(__version__=version, version=SimpleNamespace(cuda=cuda),
                           cuda=SimpleNamespace(is_available=lambda: available))


def test_nvml_cuda_version_ints_read_as_nvml_h_defines_them():
    assert cuda_version_text(12040) == "12.4" and cuda_version_text(13000) == "13.0"
    assert cuda_version_text(11080) == "11.8"


def test_pypi_torch_on_a_cuda_12_driver_is_named_with_its_fix():
    v = read_versions(fake_nvml("550.54.15", 12040), fake_torch("2.13.0", "13.0", available=False))
    assert (v["driver"], v["driver_cuda"], v["torch_cuda"]) == ("550.54.15", "12.4", "13.0")
    why = mismatch(v)
    assert "driver/CUDA mismatch" in why and ">= 580.65.06" in why and "550.54.15" in why
    assert "torch==2.10.0" in why  # PyPI's last CUDA 12 build
    assert describe(v) == ("driver 550.54.15 (CUDA 12.4 at most); torch 2.13.0 built for CUDA 13.0; "
                           "torch.cuda.is_available() False")


@pytest.mark.parametrize("driver,cuda,torch_cuda", [("580.159.03", 13000, "13.0"), ("580.159.03", 13000, "12.6"),
                                                    ("535.104.05", 12020, "12.1")])
def test_a_driver_as_new_as_torchs_cuda_is_no_mismatch(driver, cuda, torch_cuda):
    assert mismatch(read_versions(fake_nvml(driver, cuda), fake_torch(cuda=torch_cuda, available=True))) is None


def test_a_cpu_build_and_a_missing_driver_are_named():
    cpu = read_versions(fake_nvml(), fake_torch("2.13.0+cpu", None))
    assert "CPU build" in mismatch(cpu) and "none (CPU build)" in describe(cpu)

    def broken():
        raise OSError("NVML Shared Library Not Found")

    gone = read_versions(SimpleNamespace(nvmlInit=broken), fake_torch())
    assert gone["driver"] is None and "NVML Shared Library Not Found" in gone["nvml_error"]
    assert "no NVIDIA driver found through NVML" in mismatch(gone)


def test_same_major_older_minor_is_left_to_minor_version_compatibility():
    ok = read_versions(fake_nvml("525.60.13", 12000), fake_torch(cuda="12.6", available=True))
    assert mismatch(ok) is None
    refused = read_versions(fake_nvml("525.60.13", 12000), fake_torch(cuda="12.6", available=False))
    assert "minor-version compatibility" in mismatch(refused)

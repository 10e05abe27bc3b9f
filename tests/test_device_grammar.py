"""The device grammar of ``select_device`` / ``--device`` on device lists of other hosts (Intel,
AMD and NVIDIA machines, names as their OpenCL runtimes report them), not only this machine's: a
platform-name match wins over a device-name substring (PoCL's device name holds the CPU's)."""
from __future__ import annotations

import pytest

from clmf.engine.device import pick_device
from clmf.errors import NoOpenCLError

POCL = "Portable Computing Language"
XEON = "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz"
EPYC = "AMD EPYC 7763 64-Core Processor"

# (index, platform name, device name, type) in platform order, as select_device builds them
INTEL_HOST = [("0:0", POCL, f"pthread-skylake-avx512-{XEON}", "CPU"),
              ("1:0", "Intel(R) OpenCL", XEON, "CPU")]
INTEL_HOST_GPU = [("0:0", POCL, f"pthread-skylake-avx512-{XEON}", "CPU"),
                  ("1:0", "Intel(R) OpenCL Graphics", "Intel(R) UHD Graphics 630", "GPU"),
                  ("2:0", "Intel(R) OpenCL", XEON, "CPU")]
AMD_HOST = [("0:0", "AMD Accelerated Parallel Processing", "gfx90a:sramecc+:xnack-", "GPU"),
            ("0:1", "AMD Accelerated Parallel Processing", "gfx90a:sramecc+:xnack-", "GPU"),
            ("1:0", POCL, f"pthread-znver3-{EPYC}", "CPU"),
            ("2:0", "Intel(R) OpenCL", EPYC, "CPU")]
NVIDIA_HOST = [("0:0", "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "GPU"),
               ("0:1", "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "GPU"),
               ("1:0", POCL, "pthread-sapphirerapids-Intel(R) Xeon(R) Platinum 8480+", "CPU")]


def picked(spec, host):
    return host[pick_device(spec, host)][0]


@pytest.mark.parametrize("spec", ["Intel", "intel", "Intel(R)", "Intel(R) OpenCL"])
def test_intel_selects_intels_platform_on_an_intel_host(spec):
    # the defect: PoCL's device name contains "Intel(R) Xeon(R)" and PoCL comes first
    assert picked(spec, INTEL_HOST) == "1:0"
    assert picked(spec, AMD_HOST) == "2:0"


def test_platform_substring_then_device_substring():
    assert picked("Intel", INTEL_HOST_GPU) == "1:0"            # first Intel platform (graphics)
    assert picked("Intel(R) OpenCL Graphics", INTEL_HOST_GPU) == "1:0"
    assert picked("UHD", INTEL_HOST_GPU) == "1:0"               # device names when no platform
    assert picked("Xeon", INTEL_HOST) == "0:0"                  # both devices: platform order
    assert picked("Portable", INTEL_HOST) == "0:0"
    assert picked("skylake", INTEL_HOST) == "0:0"
    assert picked("AMD", AMD_HOST) == "0:0"                     # AMD's platform, not EPYC's CPU
    assert picked("EPYC", AMD_HOST) == "1:0"
    assert picked("gfx90a", AMD_HOST) == "0:0"
    assert picked("NVIDIA", NVIDIA_HOST) == "0:0"
    assert picked("H100", NVIDIA_HOST) == "0:0"
    assert picked("Xeon", NVIDIA_HOST) == "1:0"
    # "platform | device" as a whole, last
    assert picked("Intel(R) OpenCL | Intel(R) Xeon", INTEL_HOST) == "1:0"


def test_types_indices_and_auto():
    assert picked("gpu", NVIDIA_HOST) == "0:0" and picked("GPU", AMD_HOST) == "0:0"
    assert picked("cpu", NVIDIA_HOST) == "1:0" and picked("cpu", AMD_HOST) == "1:0"
    assert picked("0:1", NVIDIA_HOST) == "0:1" and picked("2", AMD_HOST) == "2:0"
    assert picked("auto", INTEL_HOST_GPU) == "1:0"               # a GPU first
    assert picked("auto", INTEL_HOST) == "0:0"
    assert picked("auto", NVIDIA_HOST) == "0:0"


@pytest.mark.parametrize("spec", ["gpu", "3:0", "Radeon", "accelerator"])
def test_nothing_matches_names_what_is_there(spec):
    with pytest.raises(NoOpenCLError, match="available: .0:0. Portable Computing Language"):
        pick_device(spec, INTEL_HOST)


def test_this_hosts_devices_follow_the_grammar():
    import clmf
    from clmf.engine.device import select_device
    try:
        infos = clmf.devices()
    except NoOpenCLError:
        pytest.skip("no OpenCL device")
    entries = [(d.index, d.platform, d.name, d.type) for d in infos]
    for d in infos:
        word = d.platform.split()[0]
        want = entries[pick_device(word, entries)]
        assert want[1].lower().find(word.lower()) >= 0
        got = select_device(word)
        assert (got.platform.name.strip(), got.name.strip()) == (want[1], want[2])

"""The device grammar of ``select_device`` / ``--device`` on device lists of other hosts (Intel,
AMD and NVIDIA machines, names as their OpenCL runtimes report them), not only this machine's: a
platform-name match wins over a device-name substring (PoCL's device name holds the CPU's)."""
from __future__ import annotations

import pytest

from clmf.engine.device import (
                                 DeviceInfo,
                                 auto_spec,
                                 device_label,
                                 label,
                                 missing_platforms,
                                 parse_spec,
                                 pick_device,
                                 pick_worker,
                                 platform_short,
                                 spec_from_text,
)
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


@pytest.mark.parametrize("spec, parsed", [
    ("auto", ("auto", None)), (" AUTO ", ("auto", None)), ("gpu", ("type", "GPU")),
    ("Cpu", ("type", "CPU")), ("accelerator", ("type", "ACCELERATOR")),
    ("1", ("index", "1:0")), ("0:1", ("index", "0:1")), ("gpu:all", ("all", "GPU")),
    ("CPU:ALL", ("all", "CPU")), ("tpu:all", ("all", "TPU")), ("Intel", ("name", "Intel")),
    ("Intel(R) OpenCL | Intel(R) Xeon", ("name", "Intel(R) OpenCL | Intel(R) Xeon"))])
def test_parse_spec(spec, parsed):
    assert parse_spec(spec) == parsed


def test_a_spec_of_several_devices_selects_no_single_one():
    # as before the one home: "gpu:all" is no device name, so one device is not found by it
    with pytest.raises(NoOpenCLError, match="no OpenCL device matches device='gpu:all'"):
        pick_device("gpu:all", NVIDIA_HOST)


def test_the_label_of_every_kind_of_device_description():
    info = DeviceInfo("1:0", "Intel(R) OpenCL", "OpenCL 3.0", "Intel", XEON, "CPU", "2025", "3.0",
                      2, 1 << 30, 1 << 28, 32768, "local", 8192, (8192,) * 3, 8, 8, 2500)
    want = f"Intel(R) OpenCL | {XEON}"
    assert label(" Intel(R) OpenCL ", XEON + "  ") == want
    assert device_label(info) == want
    assert device_label({"platform": "Intel(R) OpenCL", "device": XEON, "type": "CPU"}) == want

    class Platform:
        name = "Intel(R) OpenCL "

    class Device:                       # a pyopencl.Device's shape: platform.name, name
        platform, name = Platform(), f" {XEON}"
    assert device_label(Device()) == want
    assert str(info).startswith(f"[1:0] {want} (CPU, 2 CUs")
    # the label selects the device again, on a host where the device name holds the CPU's
    assert picked(want, INTEL_HOST) == "1:0"
    assert picked(label(POCL, INTEL_HOST[0][2]), INTEL_HOST) == "0:0"


def test_worker_rank_rule_takes_the_hosts_devices_of_the_type_in_turn():
    def worker(spec, rank, host):
        return host[pick_worker(spec, rank, host)][0]
    assert [worker("gpu", r, NVIDIA_HOST) for r in range(3)] == ["0:0", "0:1", "0:0"]
    assert [worker("auto", r, AMD_HOST) for r in range(3)] == ["0:0", "0:1", "0:0"]
    assert [worker("cpu", r, AMD_HOST) for r in range(3)] == ["1:0", "2:0", "1:0"]
    assert [worker("cpu", r, INTEL_HOST_GPU) for r in range(2)] == ["0:0", "2:0"]
    assert worker("auto", 1, INTEL_HOST) == "1:0"              # a CPU host: its CPUs in turn
    with pytest.raises(NoOpenCLError):
        pick_worker("gpu", 0, INTEL_HOST)


def test_auto_reads_clmf_device_then_pyopencl_ctx(monkeypatch):
    monkeypatch.delenv("CLMF_DEVICE", raising=False)
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    assert auto_spec() == ("auto", "device=")
    monkeypatch.setenv("PYOPENCL_CTX", "1")
    assert auto_spec() == ("1:0", "PYOPENCL_CTX=")
    monkeypatch.setenv("PYOPENCL_CTX", "0:1")
    assert auto_spec() == ("0:1", "PYOPENCL_CTX=")
    monkeypatch.setenv("CLMF_DEVICE", "Intel")
    assert auto_spec() == ("Intel", "CLMF_DEVICE=")
    monkeypatch.setenv("CLMF_DEVICE", "")                       # empty: not set
    assert auto_spec() == ("0:1", "PYOPENCL_CTX=")


def test_required_platforms_match_platform_names_only(monkeypatch):
    names = [POCL]                      # PoCL alone, its device named after an Intel CPU
    assert missing_platforms(names, "Portable Computing Language, Intel(R) OpenCL") == [
        "Intel(R) OpenCL"]
    assert missing_platforms(names, ["Intel"]) == ["Intel"]
    assert missing_platforms([POCL, "Intel(R) OpenCL"], "Intel,Portable,") == []
    monkeypatch.setenv("CLMF_REQUIRE_PLATFORMS", "NVIDIA")
    assert missing_platforms(names) == ["NVIDIA"]
    monkeypatch.delenv("CLMF_REQUIRE_PLATFORMS")
    assert missing_platforms(names) == []


def test_command_line_device_lists():
    assert spec_from_text("0:0,0:1") == ["0:0", "0:1"]
    assert spec_from_text("gpu:all") == "gpu:all"
    assert spec_from_text("Intel,") == ["Intel"]


def test_this_hosts_devices_found_by_their_label_and_ranked_on_by_a_multi_device_model():
    import clmf
    from clmf.engine.device import device_present, find_device, select_device, select_devices
    from clmf.inference.ranking import DeviceRankingMixin
    try:
        infos = clmf.devices()
    except NoOpenCLError:
        pytest.skip("no OpenCL device")
    for d in infos:
        dev = find_device(d.platform, d.name)
        assert device_label(dev) == device_label(d) and device_present(d)
        assert device_label(select_device(device_label(d))) == device_label(d)   # selects again
    assert find_device(POCL, "no such device") is None

    class Model(DeviceRankingMixin):
        device = [infos[-1].index, infos[0].index] if len(infos) > 1 else infos[0].index
    # a model fitted on several devices ranks on its first (it ranked on the host: the one-device
    # grammar refused its list)
    want = select_devices(Model.device)[0]
    assert Model()._inference_device().int_ptr == want.int_ptr


def test_platform_short_names_read_the_platform_not_the_device():
    assert [platform_short(e[1]) for e in INTEL_HOST_GPU] == ["pocl", "intel", "intel"]
    assert [platform_short(e[1]) for e in AMD_HOST] == ["amd", "amd", "pocl", "intel"]
    assert platform_short("NVIDIA CUDA") == "nvidia"
    assert platform_short("Apple") == "apple" and platform_short("(R)") == "r"
    assert platform_short("***") == "ocl"

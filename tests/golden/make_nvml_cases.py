"""Rebuilds the CONSTRUCTED NVML recordings of the golden cases (run from the repo root):

    uv run python tests/golden/make_nvml_cases.py

nvml-h100-8gpu / nvml-a100-8gpu: testbed.nvml.construct, 8 GPUs, 2 ticks; the A100 node's
  GPU 5 runs its PCIe link at x8 of x16 (trained down).
nvml-gpu-lost: 2 H100s; at tick 1 GPU 1 answers GPU_IS_LOST to everything and NVML delivers a
  critical XID 79 event for it; tick 2 it is still lost (no second gpu_lost event).
nvml-driver-reload: 2 H100s; at tick 2 the driver was reloaded: energy, volatile ECC and NVLink
  byte counters start again from (near) zero. The agent writes them raw; analytics handles it.
  GPU 1's registration with Fabric Manager is still in progress at tick 2 (not usable yet).
xid-kmsg-job: 2 H100s; GPU 1's process is gone from tick 1 on (its kernel-log XIDs, read at
  tick 1 and 2, must still name the job it belonged to).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden.collector.nvml.backend import ERROR_GPU_IS_LOST
from gpuwarden.collector.nvml.recorded import call_key
from gpuwarden.collector.sources.nvml.poll import GPU_FIELD_IDS, NVLINK_SCOPED, field_request
from testbed.nvml.construct import construct

HERE = Path(__file__).parent


def save(doc: dict, case: str) -> None:
    (HERE / case / "nvml.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main() -> None:
    save(construct("h100", ticks=2, gpus=8), "nvml-h100-8gpu")
    a100 = construct("a100", ticks=2, gpus=8)
    a100["ticks"][0]["answers"][call_key(5, "nvmlDeviceGetCurrPcieLinkWidth", ())] = {"v": 8}
    a100["note"] += "; GPU 5's PCIe link trained down to x8"
    save(a100, "nvml-a100-8gpu")

    lost = construct("h100", ticks=3, gpus=2, seed=1)
    all_keys = {k for t in lost["ticks"] for k in t["answers"]}
    lost["ticks"][1]["answers"].update(
        {k: {"e": ERROR_GPU_IS_LOST} for k in all_keys if k.startswith("1|")}
    )
    lost["ticks"][1]["events"] = [[1, 8, 79]]
    lost["ticks"][2]["answers"] = {
        k: v for k, v in lost["ticks"][2]["answers"].items() if not k.startswith("1|")
    }
    lost["note"] += "; GPU 1 lost at tick 1 (XID 79)"
    save(lost, "nvml-gpu-lost")

    reload_ = construct("h100", ticks=3, gpus=2, seed=2)
    request = field_request(18)
    reset = {
        GPU_FIELD_IDS["energy_j_total"][0]: 5_000,
        GPU_FIELD_IDS["ecc_sbe_volatile_total"][0]: 0,
    }
    for fid in (NVLINK_SCOPED["tx_bytes_total"], NVLINK_SCOPED["rx_bytes_total"]):
        reset[fid] = 4096
    for gpu in range(2):
        key = call_key(gpu, "nvmlDeviceGetFieldValues", (request,))
        answers = reload_["ticks"][2]["answers"][key]["v"]
        for n, (fid, _scope) in enumerate(request):
            if fid in reset and answers[n][0] == 0:
                answers[n][1] = reset[fid]
    fabric = call_key(1, "nvmlDeviceGetGpuFabricInfo", ())
    reload_["ticks"][2]["answers"][fabric] = {"v": [2, 0, 0b10101010]}  # IN_PROGRESS
    reload_["note"] += "; driver reloaded before tick 2 (counters restart, GPU 1 re-registering)"
    save(reload_, "nvml-driver-reload")

    killed = construct("h100", ticks=3, gpus=2, seed=3)
    for tick in killed["ticks"][1:]:
        tick["answers"][call_key(1, "nvmlDeviceGetComputeRunningProcesses", ())] = {"v": []}
    killed["note"] += "; GPU 1's process is gone from tick 1 on"
    save(killed, "xid-kmsg-job")


if __name__ == "__main__":
    main()

"""What each GPU is and how it is set up: the ``gpu_info`` point of the NVML source.

Serial number and VBIOS (what an RMA asks for), the driver version, and the modes an operator
sets and expects the same on every GPU of a fleet: persistence mode, ECC, MIG (each with the
mode that waits for the next reset, where NVML has one). Asked when the agent starts and every
``info_every_s`` after (an administrator may change a mode at any time), not every cycle: none
of it is a measurement. A GPU that does not answer a question leaves that field out.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.collector.nvml.backend import NvmlError
from gpuwarden.collector.sources.nvml.poll import Device, Reader
from gpuwarden.core.store.lineprotocol import Point

# (label, call): each answered by the device
INFO_CALLS: tuple[tuple[str, str], ...] = (
    ("serial", "nvmlDeviceGetSerial"),
    ("vbios", "nvmlDeviceGetVbiosVersion"),
    ("persistence", "nvmlDeviceGetPersistenceMode"),
    ("ecc_mode", "nvmlDeviceGetEccMode"),  # [current, pending]
    ("mig_mode", "nvmlDeviceGetMigMode"),  # [current, pending]
)


def driver_version(reader: Reader) -> str:
    """The driver's version, or "" where NVML does not say (it is the same for every GPU)."""
    try:
        return str(reader.backend.call(None, "nvmlSystemGetDriverVersion"))
    except NvmlError:
        return ""


def read_info(reader: Reader, dev: Device) -> dict[str, Any]:
    return {label: reader.ask(dev, label, name) for label, name in INFO_CALLS}


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _flag(value: Any) -> bool | None:
    return bool(value) if isinstance(value, int) and value in (0, 1) else None


def parse_info(raw: dict[str, Any], driver: str) -> dict[str, Any]:
    """``gpu_info`` fields from the answers (pure); anything malformed is left out."""
    f: dict[str, Any] = {}
    for label, name in (("serial", "serial"), ("vbios", "vbios_version")):
        if (text := _text(raw.get(label))) is not None:
            f[name] = text
    if driver:
        f["driver_version"] = driver
    if (flag := _flag(raw.get("persistence"))) is not None:
        f["persistence_mode_active"] = flag
    for label in ("ecc_mode", "mig_mode"):
        pair = raw.get(label)
        if isinstance(pair, list) and len(pair) == 2:
            for suffix, value in zip(("", "_pending"), pair, strict=True):
                if (flag := _flag(value)) is not None:
                    f[f"{label}{suffix}_active"] = flag
    return f


def info_point(tags: dict[str, str], fields: dict[str, Any], now_ns: int) -> Point | None:
    """The ``gpu_info`` point under the GPU's own tags (cluster, node, gpu, uuid, model)."""
    keep = {
        k: v for k, v in tags.items() if k in ("cluster", "node", "gpu", "gpu_uuid", "gpu_model")
    }
    return Point("gpu_info", keep, fields, now_ns) if fields else None

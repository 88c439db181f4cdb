"""The agent's configuration: TOML file, then environment overrides, over the defaults.

``config/agent.sample.toml`` lists every setting with its default (a test checks it equals
:data:`DEFAULTS`). An environment variable ``GPUWARDEN_<SECTION>_<KEY>`` overrides one setting,
e.g. ``GPUWARDEN_AGENT_INTERVAL_S=5`` or ``GPUWARDEN_SINK_URL=http://influx:8086``; lists are
comma-separated and booleans are ``true``/``false``/``1``/``0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.config import ConfigError, merge_config
from gpuwarden.core.names import BadNameError, ClusterName, NodeName
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.store.sink import SinkConfig
from gpuwarden.core.xidcat import DEFAULT_FATAL_XIDS

__all__ = ["DEFAULTS", "AgentConfig", "ConfigError", "load_config"]


#: the longest any [check] timeout may be (a week: a DCGM level-4 diagnostic takes hours)
MAX_TIMEOUT_S = 7 * 86400.0

DEFAULTS: dict[str, dict[str, Any]] = {
    "agent": {
        "cluster": "default",
        "node": "",
        "interval_s": 10.0,
        "source_timeout_s": 5.0,
        "sources": ["nvml", "xid", "infiniband", "power", "thermal", "host"],
        "sysfs": "/sys",
        "procfs": "/proc",
        "kmsg": "/dev/kmsg",
        # the kernel log from the host's systemd journal instead of kmsg: the host's root as
        # mounted here (its var/log/journal and run/log/journal below it, e.g. "/host"), read
        # with journalctl; "" = off (collector.sources.journal)
        "kernel_journal": "",
        "remediation_url": "",
        "remediation_token_file": "",
        # the fast path signs what it posts as remediation_identity (this node's identity at
        # the engine; "{node}" in it is this node's name, e.g. "agents/{node}") with the key
        # in remediation_hmac_secret_file (legacy: the shared secret)
        "remediation_identity": "",
        "remediation_hmac_secret_file": "",
        # an https remediation_url: the CA that signed the engine's certificate ("" = system
        # CAs), and this agent's own certificate for an engine that requires one (mutual TLS)
        "remediation_ca_file": "",
        "remediation_cert_file": "",
        "remediation_key_file": "",
        "reporter_listen": "127.0.0.1:9465",
        "reporter_socket": "",
        "reporter_tls_cert_file": "",
        "reporter_tls_key_file": "",
        # lines a second one job may send through the relay, on average (a minute's worth at
        # once); more: 429, sent again later. 0: no limit (collector.relay.LineRate)
        "reporter_lines_per_s": 200.0,
        "metrics_listen": "",
        "metrics_gpu": True,
        # the liveness and readiness probes (collector.probes: GET /livez, /readyz), e.g.
        # "127.0.0.1:9467"; "" = off. Not ready once a source failed this many cycles in a row
        "health_listen": "",
        "health_fail_cycles": 3,
        # > 0: read every interval_s, write each series once per this many seconds (gauges:
        # mean, _min, _max; the rest: last value; events at once). 0: write every reading
        "write_every_s": 0.0,
    },
    "nvml": {
        "backend": "pynvml",
        "recording": "",
        "loop": False,
        "follow": False,
        "nvlink": True,
        "gpm": True,
        "processes": True,
        "pcie_concurrent": True,
        "events": "thread",
        "jobmap_dir": "/run/gpuwarden/jobs",
        "pod_resources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "pod_resources_refresh_s": 30.0,
        "pod_resources_names": ["nvidia.com/gpu", "nvidia.com/gpu.shared"],
        "fabric_grace_s": 600.0,
        "info_every_s": 600.0,
    },
    "xid": {
        "path": "",
        "lookback_s": 300.0,
        "follow_s": 0.1,
        "fatal_xids": list(DEFAULT_FATAL_XIDS),
        "extra_fatal_xids": [],
        "not_fatal_xids": [],
        # one XID code repeating on one GPU is one episode (one fast-path finding) until the GPU
        # has been quiet of that code this long (kernel log and NVML alike)
        "xid_recovery_s": 300.0,
        # ... and while it goes on, its finding is sent again this often (one lost or refused
        # finding is not the last word on a GPU that keeps failing); 0 = never
        "xid_resend_s": 600.0,
        "os_rules": True,
        "os_recovery_s": 300.0,
        # with [agent] kernel_journal: where the last record read is kept across restarts
        "journal_cursor_file": "/var/lib/gpuwarden/kernel-journal.cursor",
    },
    "infiniband": {
        "hcas": [],
        "rediscover_cycles": 60,
        "flap_count": 3,
        "flap_window_s": 600.0,
        "flap_recovery_s": 600.0,
    },
    "host": {"ce_threshold": 10, "ce_window_s": 3600.0, "blocked_for_s": 300.0},
    "power": {"rapl": True, "hwmon": True},
    "thermal": {"thermal_zones": True, "hwmon": True},
    "health": {
        "healthy_after_s": 1800.0,
        "expected_gpus": 0,
        "gpu_count_check": True,
        # the node check run before node_healthy is said ([] = say it without one)
        "check_probes": ["gpu_count", "infiniband", "disk"],
        # finding kinds besides critical ones that start the healthy stretch again
        "restart_on": ["link_flap"],
        # say node_healthy again (after a fresh check) every this long while healthy; 0: once
        "reannounce_s": 0.0,
    },
    # gpuwarden check: the active node check (collector.check)
    "check": {
        "probes": ["gpu_count", "infiniband", "disk", "dcgm"],
        "ib_rate_gbps": 0.0,
        # how many physical InfiniBand devices a node has (under /sys/class/infiniband, RoCE
        # ones and a RoCE bond included, SR-IOV virtual functions not; of [infiniband] hcas
        # when it lists them); 0: not set. Set, a node showing fewer fails infiniband: one HCA
        # of eight fallen off the bus leaves seven ports ACTIVE, which pass otherwise
        "expected_hcas": 0,
        "disk_paths": ["/tmp"],
        "disk_timeout_s": 10.0,
        "dcgm_level": 1,
        "probe_timeout_s": 30.0,
        "deadline_s": 45.0,
        "report_timeout_s": 4.0,
        # a node with no HCA passes infiniband as unavailable (a cloud VM, a workstation); a
        # port down still fails. InfiniBand sites take it out, so HCAs gone from sysfs fail
        "optional": ["infiniband", "dcgm", "gpu_matmul", "allreduce"],
    },
    "sink": SinkConfig().to_mapping(),
}


@dataclass(frozen=True)
class AgentConfig:
    sections: Mapping[str, Mapping[str, Any]]

    def __getitem__(self, section: str) -> Mapping[str, Any]:
        return self.sections[section]

    @property
    def sink(self) -> SinkConfig:
        """The sink's settings, its password and token read from their files."""
        return SinkConfig.from_mapping(dict(self.sections["sink"])).with_secrets()

    def source_settings(self, name: str) -> dict[str, Any]:
        """A source's settings; the XID lists are shared by the nvml and xid sources."""
        settings = dict(self.sections.get(name, {}))
        if name == "nvml":
            xid = self.sections["xid"]
            for key in (
                "fatal_xids",
                "extra_fatal_xids",
                "not_fatal_xids",
                "xid_recovery_s",
                "xid_resend_s",
            ):
                settings[key] = xid[key]
        return settings

    def fast_path_poster(
        self, node: str, timeout_s: float = 5.0, *, outbox: bool = False
    ) -> FindingPoster | None:
        """The poster of findings to the engine (``[agent] remediation_url``; ``None``: off),
        signing as ``remediation_identity`` with ``{node}`` in it replaced by ``node``, so one
        configuration serves every node of a family (``"agents/{node}"``, as the shipped
        DaemonSet's ConfigMap has it) while each node signs with its own derived key. With
        ``outbox`` (the agent that writes to InfluxDB), critical findings wait on disk in
        ``<[sink] spool_dir>/findings`` until the engine has them (:class:`core.poster.Outbox`)."""
        a = self.sections["agent"]
        if not a["remediation_url"]:
            return None
        return FindingPoster(
            a["remediation_url"], a["remediation_token_file"],
            secret_file=a["remediation_hmac_secret_file"],
            identity=a["remediation_identity"].replace("{node}", node),
            ca_file=a["remediation_ca_file"],
            cert_file=a["remediation_cert_file"], key_file=a["remediation_key_file"],
            timeout_s=timeout_s,
            # critical findings on disk until the engine has them (beside the spool's files)
            outbox=str(Path(self.sections["sink"]["spool_dir"]) / "findings") if outbox else "",
        )  # fmt: skip


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    config = AgentConfig(merge_config(DEFAULTS, path, environ, "agent"))
    SinkConfig.from_mapping(dict(config["sink"]))  # validates [sink] now, not at first write
    if config["agent"]["interval_s"] <= 0 or config["agent"]["source_timeout_s"] <= 0:
        raise ConfigError("agent.interval_s and agent.source_timeout_s must be positive")
    c = config["check"]
    for key in ("disk_timeout_s", "probe_timeout_s", "deadline_s", "report_timeout_s"):
        # a week at most: past threading's TIMEOUT_MAX a wait raises, past the report's
        # except (a healthy node drained 'without naming a probe')
        if not 0 < float(c[key]) <= MAX_TIMEOUT_S:
            raise ConfigError(f"check.{key} must be more than 0 and at most {MAX_TIMEOUT_S:g} s, "
                              f"got {c[key]!r}")  # fmt: skip
    if c["expected_hcas"] < 0:  # an integer already (merge_config)
        raise ConfigError(f"check.expected_hcas must be 0 or more, got {c['expected_hcas']}")
    a = config["agent"]
    if a["health_fail_cycles"] < 1:
        raise ConfigError("agent.health_fail_cycles must be at least 1")
    if not (a["reporter_lines_per_s"] == 0 or a["reporter_lines_per_s"] * 60 >= 5000):
        raise ConfigError(
            "agent.reporter_lines_per_s must be 0 (no limit) or at least 83.4: a reporter "
            "sends up to 5,000 lines at once, a minute's worth at most"
        )
    if a["kernel_journal"] and config["xid"]["path"]:
        raise ConfigError("[agent] kernel_journal and [xid] path both name the kernel log: "
                          "set one")  # fmt: skip
    for key in ("health_listen", "metrics_listen", "reporter_listen"):
        _check_listen(key, a[key])
    try:  # they name every finding the agent sends: refused here, not at the first XID
        ClusterName(config["agent"]["cluster"])
        if config["agent"]["node"]:
            NodeName(config["agent"]["node"])
    except BadNameError as exc:
        raise ConfigError(f"agent: {exc}") from None
    return config


def _check_listen(key: str, listen: str) -> None:
    """``host:port`` (or empty: off); refused at start, not when the listener is opened."""
    if not listen:
        return
    _, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"agent.{key} must be host:port (port 1-65535), got {listen!r}")

"""Analytics configuration: TOML file, then ``GPUWARDEN_<SECTION>_<KEY>`` overrides, over the
defaults. ``config/analytics.sample.toml`` lists every setting with its default (a test checks
it equals :data:`DEFAULTS`)."""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuwarden.analytics.congestion import CongestionConfig
from gpuwarden.analytics.culprit import StopConfig
from gpuwarden.analytics.drift import DriftConfig
from gpuwarden.analytics.drift import config_from as drift_config
from gpuwarden.analytics.hangs import HangConfig
from gpuwarden.analytics.hangs import config_from as hang_config
from gpuwarden.analytics.jobfaults import JobFaultConfig
from gpuwarden.analytics.jobfaults import config_from as jobfault_config
from gpuwarden.analytics.jobfaults import defaults as jobfault_defaults
from gpuwarden.analytics.mfu import MfuConfig
from gpuwarden.analytics.stragglers import StragglerConfig
from gpuwarden.core.config import ConfigError, merge_config, read_secret
from gpuwarden.core.xidcat import DEFAULT_FATAL_XIDS

SENT_SECRETS = "_secrets"  # [influxdb] key with_secrets() fills; never read from a file

DEFAULTS: dict[str, dict[str, Any]] = {
    "influxdb": {
        "url": "http://127.0.0.1:8086",
        "database": "gpuwarden",
        "retention_policy": "",
        "username": "",
        "password_file": "",
        "token_file": "",
    },
    "dask": {
        "scheduler": "",
        "workers": 2,
        "threads_per_worker": 1,
        "polars_threads": 1,
        # how Dask workers get the InfluxDB password or token: "workers" (each worker reads
        # [influxdb] password_file / token_file at that path on its own machine) or "send" (the
        # analyze service reads them and sends them with each task: only to a LocalCluster, a
        # loopback scheduler or a tls:// one, never in clear over the network)
        "credentials": "workers",
    },
    "analysis": {
        "cluster": "",
        "window_s": 3600.0,
        "ib_bucket_s": 10,
        "gpu_bucket_s": 60,
        "nodes_per_task": 32,
        # a job's step log is read in groups of this many nodes (influxd merges fewer series)
        "nodes_per_read": 128,
        "topology": "",
        "write_back": True,
        "spool_dir": "/var/lib/gpuwarden/analytics-spool",
        # a node whose agent reported in the window but not for this long: node_silent (0: off)
        "silent_after_s": 60.0,
        # Prometheus /metrics of the running service (--every), e.g. "0.0.0.0:9471"; "" = off
        "metrics_listen": "",
    },
    "mfu": asdict(MfuConfig()),
    "stragglers": asdict(StragglerConfig()),
    "congestion": asdict(CongestionConfig()),
    "drift": asdict(DriftConfig()),
    "hangs": asdict(HangConfig()),
    "stops": asdict(StopConfig()),
    # application XIDs: a whole job's (job_app_fault) or one GPU's across jobs (lemon rule)
    "jobfaults": jobfault_defaults(),
    "findings": {
        "url": "",
        "token_file": "",
        "identity": "",
        "hmac_secret_file": "",
        "ca_file": "",
        "cert_file": "",
        "key_file": "",
    },
    "cadence": {
        "lookback_s": 30 * 86400.0,
        "merge_s": 600.0,
        "prior_faults": 5.0,
        "prior_scale": 1.0,
        "restart_s": 600.0,
        "min_interval_s": 60.0,
        "min_gain": 0.01,
        # set the interval by the faults no failure_risk finding warned of: right where a
        # policy moves jobs off nodes at risk (a warned fault then costs no recomputation)
        "discount_announced": False,
        "announce_window_s": 7200.0,
    },
    "predictor": {
        # a model trained by `gpuwarden analyze train`; empty: no online failure-risk scoring
        "model": "",
        "step_s": 60,
        # GPU nodes per feature task (Dask runs the tasks in parallel)
        "nodes_per_task": 8,
        "horizons_s": [600, 3600, 7200, 86400],
        # the horizon a trained model predicts, and the one its findings are about
        "horizon_s": 7200,
        # label rules: which events count as a failure to predict
        "fatal_xids": list(DEFAULT_FATAL_XIDS),
        "label_dbe": True,
        "label_link_down": True,
        "label_node_down": True,
        "label_nvswitch_sxid": True,
        "label_gpu_lost": True,
        "label_row_remap_failure": True,
        # a GPU or node is out of service (not scored, not evaluated) this long after a failure:
        # about the median repair time of hardware faults in the real StepFun trace (1.4 days)
        "down_s": 86400.0,
        # the operating threshold is the lowest risk whose alerts reach this precision on the
        # validation slice of the training period
        "min_precision": 0.9,
        # 0: use the model's own operating threshold
        "risk_threshold": 0.0,
    },
}


@dataclass(frozen=True)
class AnalyticsConfig:
    sections: Mapping[str, Mapping[str, Any]]

    def __getitem__(self, section: str) -> Mapping[str, Any]:
        return self.sections[section]

    @property
    def mfu(self) -> MfuConfig:
        return MfuConfig(**self.sections["mfu"])

    @property
    def stragglers(self) -> StragglerConfig:
        return StragglerConfig(**self.sections["stragglers"])

    @property
    def congestion(self) -> CongestionConfig:
        return CongestionConfig(**self.sections["congestion"])

    @property
    def drift(self) -> DriftConfig:
        return drift_config(self.sections["drift"])

    @property
    def stops(self) -> StopConfig:
        return StopConfig(**self.sections["stops"])

    @property
    def jobfaults(self) -> JobFaultConfig:
        return jobfault_config(self.sections["jobfaults"])

    @property
    def hangs(self) -> HangConfig:
        return hang_config(self.sections["hangs"])

    def reader_kwargs(self) -> dict[str, Any]:
        """The InfluxDB reader's settings. On a Dask worker this runs in the worker: unless
        :meth:`with_secrets` put them in, the secret files are read there, at their paths on
        the worker's machine (``[dask] credentials = "workers"``)."""
        db = self.sections["influxdb"]
        sent = db.get(SENT_SECRETS)
        if sent is not None:
            password, token = sent
        else:
            try:
                password, token = read_secret(db["password_file"]), read_secret(db["token_file"])
            except ConfigError as exc:
                where = socket.gethostname()
                raise ConfigError(
                    f"on {where}: {exc} ([dask] credentials = 'workers': each worker reads "
                    "the InfluxDB secret files at these paths on its own machine; put them "
                    "there, or set credentials = 'send')"
                ) from None
        return {
            "url": db["url"],
            "database": db["database"],
            "retention_policy": db["retention_policy"] or None,
            "username": db["username"] or None,
            "password": password or None,
            "token": token or None,
        }

    def with_secrets(self) -> AnalyticsConfig:
        """A copy that carries the InfluxDB password and token themselves (read here, now),
        for ``[dask] credentials = "send"``: the tasks pickled for the workers carry them."""
        db = self.sections["influxdb"]
        if SENT_SECRETS in db:  # already read
            return self
        data = {k: dict(v) for k, v in self.sections.items()}
        data["influxdb"][SENT_SECRETS] = (
            read_secret(db["password_file"]),
            read_secret(db["token_file"]),
        )
        return AnalyticsConfig(data)


def check_send(scheduler: str) -> None:
    """``credentials = "send"`` puts the InfluxDB secrets in the tasks: allowed to a
    LocalCluster (no scheduler), a loopback scheduler or a TLS one, never over the network in
    clear (Dask's plain ``tcp://`` is not encrypted)."""
    if not scheduler or scheduler.startswith("tls://"):
        return
    host = urllib.parse.urlsplit(scheduler if "://" in scheduler else f"tcp://{scheduler}")
    if host.hostname in ("127.0.0.1", "localhost", "::1"):
        return
    raise ConfigError(
        f"dask.credentials = 'send' to {scheduler} would send the InfluxDB secrets in clear: "
        "use a tls:// scheduler (Dask TLS), or credentials = 'workers' with the secret files "
        "on each worker"
    )


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> AnalyticsConfig:
    config = AnalyticsConfig(merge_config(DEFAULTS, path, environ, "analytics"))
    a = config["analysis"]
    if a["window_s"] <= 0 or a["ib_bucket_s"] < 1 or a["gpu_bucket_s"] < 1:
        raise ConfigError("analysis.window_s, ib_bucket_s and gpu_bucket_s must be positive")
    if config["dask"]["credentials"] not in ("workers", "send"):
        raise ConfigError("dask.credentials must be 'workers' or 'send'")
    if config["dask"]["credentials"] == "send":
        check_send(config["dask"]["scheduler"])
    if config["cadence"]["announce_window_s"] <= 0:
        raise ConfigError("cadence.announce_window_s must be positive")
    if a["nodes_per_task"] < 1 or a["nodes_per_read"] < 1 or config["dask"]["workers"] < 1:
        raise ConfigError(
            "analysis.nodes_per_task, analysis.nodes_per_read and dask.workers must be at least 1"
        )
    try:
        config.mfu  # noqa: B018  (validates [mfu] now, not at the first analysis)
        config.drift  # noqa: B018
        config.hangs  # noqa: B018
        config.stops  # noqa: B018
        config.jobfaults  # noqa: B018
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return config


def with_overrides(config: AnalyticsConfig, **sections: Mapping[str, Any]) -> AnalyticsConfig:
    """A copy with some settings replaced (tests and the benchmark use it)."""
    data = {k: dict(v) for k, v in config.sections.items()}
    for section, values in sections.items():
        unknown = set(values) - set(DEFAULTS[section])
        if unknown:
            raise ConfigError(f"unknown settings {section}.{sorted(unknown)}")
        data[section].update(values)
    return AnalyticsConfig(data)

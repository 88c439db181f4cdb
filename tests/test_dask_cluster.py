"""Issue 28, item 4: the analysis on a real Dask cluster reached by its address, against an
InfluxDB that requires credentials.

REAL: influxd 1.x with ``auth-enabled``, a ``dask scheduler`` and two ``dask worker`` processes
started as separate processes (as on separate machines, here on loopback). SIMULATED: the
telemetry (the ``slow-gpu`` scenario, 40 min of 16 nodes).

How the workers get the InfluxDB password is stated in ``[dask] credentials``:

* ``workers``: each worker reads ``[influxdb] password_file`` at that path on its own machine.
  A worker without the file fails with an error that names the file and the setting;
* ``send``: the analyze service reads the secret and sends it with each task (the workers need
  no file); refused towards a plain ``tcp://`` scheduler that is not on loopback, where it
  would cross the network in clear.

Either way the results equal a local run (no Dask) of the same window.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.analytics.config import load_config, with_overrides
from gpuwarden.analytics.emit import findings
from gpuwarden.analytics.runner import DaskExecutor, LocalExecutor, analyse
from gpuwarden.analytics.topology import write_topology
from gpuwarden.core.config import ConfigError
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from gpuwarden.simulation.spec import load_spec
from testbed.influxd import LocalInfluxd, free_port
from tests.remediation_util import poll

ROOT = Path(__file__).resolve().parent.parent
DASK = [str(Path(sys.executable).with_name("dask"))]
USER, PASSWORD = "gpuwarden", "s3cret-for-tests"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalInfluxd, str]]:
    """An influxd that requires credentials, and a Dask scheduler with two workers."""
    tmp = tmp_path_factory.mktemp("dask-cluster")
    influxd = LocalInfluxd(tmp / "influxd", auth=(USER, PASSWORD)).start()
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([*DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]  # fmt: skip
    for i in range(2):
        procs.append(subprocess.Popen(
            [*DASK, "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
             "--memory-limit", "2GiB", "--name", f"w{i}"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # this checkout's code, whatever the environment's installed copy is
            env={**os.environ, "POLARS_MAX_THREADS": "1", "PYTHONPATH": str(ROOT)},
        ))  # fmt: skip
    try:
        yield influxd, address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        influxd.stop()


def _load(influxd: LocalInfluxd, tmp: Path) -> tuple[object, tuple[int, int]]:
    influxd.create_database("scale")
    spec = dataclasses.replace(
        load_spec("slow-gpu"), duration_s=2400,
        measurements=("gpu", "ib_port", "job_step", "job_model"),
    ).validate()  # fmt: skip
    gen = ScenarioGenerator(spec, seed=1)
    sink = InfluxSink(SinkConfig(url=influxd.url, database="scale", username=USER,
                                 password=PASSWORD, spool_dir=str(tmp / "spool"),
                                 batch_size=20_000))  # fmt: skip
    for chunk in gen.chunks(ticks_per_chunk=60):
        for m, df in chunk.items():
            sink.write_frame(df, m, tags=[t for t in TAGS[m] if t in df.columns])
    assert sink.close(timeout_s=120)
    write_topology(dict(zip(gen.node_names, gen.switch_of, strict=True)), tmp / "topology.csv")
    return gen, (spec.start_ns, spec.start_ns + spec.duration_s * 10**9 + 1)


def test_a_real_dask_cluster_gives_the_local_results_with_credentials_stated(
    cluster: tuple[LocalInfluxd, str], tmp_path: Path
) -> None:
    influxd, address = cluster
    _, (start, end) = _load(influxd, tmp_path)
    secret = tmp_path / "influx-password"
    secret.write_text(PASSWORD + "\n")

    def config(credentials: str):
        return with_overrides(
            load_config(environ={}),
            influxdb={"url": influxd.url, "database": "scale", "username": USER,
                      "password_file": str(secret)},
            analysis={"topology": str(tmp_path / "topology.csv"),
                      "spool_dir": str(tmp_path / "aspool")},
            dask={"scheduler": address, "credentials": credentials},
        )  # fmt: skip

    local = analyse(config("workers"), start, end, LocalExecutor())
    want = [f.to_json() for f in findings(local)]
    assert any(f["kind"] == "straggler" for f in want)  # there is something to agree on

    executor = DaskExecutor(address)
    poll(lambda: len(executor.client.scheduler_info()["workers"]) == 2, 60, "two workers")
    try:
        assert "scheduler tcp://127.0.0.1" in executor.describe()
        # workers: each reads the password file itself (here, the same machine's file)
        by_file = analyse(config("workers"), start, end, executor)
        assert [f.to_json() for f in findings(by_file)] == want
        sent_cfg = config("send")
        # the file goes away: a worker that must read it says which file and which setting...
        secret.unlink()
        with pytest.raises(ConfigError, match=r"influx-password.*credentials = 'send'"):
            analyse(config("workers"), start, end, executor)
        # ...while "send" reads it once, in the service, and the tasks carry it
        secret.write_text(PASSWORD + "\n")
        sent = sent_cfg.with_secrets()
        secret.unlink()
        assert [f.to_json() for f in findings(analyse(sent, start, end, executor))] == want
        # and "send" by itself (analyse reads the secret, then the workers need no file)
        secret.write_text(PASSWORD + "\n")
        assert [f.to_json() for f in findings(analyse(sent_cfg, start, end, executor))] == want
    finally:
        executor.close()
    jobs = [j.job for j in local.jobs]
    assert jobs and [j.job for j in by_file.jobs] == jobs
    mfu = [(j.mfu.mfu if j.mfu else None) for j in local.jobs]
    assert mfu[0] is not None and [(j.mfu.mfu if j.mfu else None) for j in by_file.jobs] == mfu


def test_sending_secrets_in_clear_over_the_network_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(
        '[dask]\nscheduler = "tcp://10.1.2.3:8786"\ncredentials = "send"\n'
    )
    with pytest.raises(ConfigError, match="in clear"):
        load_config(tmp_path / "a.toml", environ={})
    for ok in ("tls://10.1.2.3:8786", "tcp://127.0.0.1:8786", ""):
        (tmp_path / "b.toml").write_text(f'[dask]\nscheduler = "{ok}"\ncredentials = "send"\n')
        assert load_config(tmp_path / "b.toml", environ={})["dask"]["credentials"] == "send"
    (tmp_path / "c.toml").write_text('[dask]\ncredentials = "maybe"\n')
    with pytest.raises(ConfigError, match="credentials"):
        load_config(tmp_path / "c.toml", environ={})

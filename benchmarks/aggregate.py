"""Points and fields into influxd per node: collecting at 1 Hz and writing every reading, against
writing once per 10 s window (``[agent] write_every_s = 10``), from the same readings.

One agent on the CONSTRUCTED 8x H100 recording and a built 8-HCA sysfs tree collects
``--cycles`` (600) cycles stamped 1 s apart; each cycle goes raw into one database of a real
influxd (started here) and through the aggregating sink into another. Reported: points and
fields per second of collection for each, as influxd counted them (``SELECT count(*)``), and
their ratio. Last line: ``ingest_ratio=<raw fields / aggregated fields>``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from gpuwarden.collector import cli as agent_cli
from gpuwarden.collector.aggregate import AggregatingSink
from gpuwarden.collector.config import load_config
from gpuwarden.core.store.sink import InfluxSink, SinkConfig
from testbed.influxd import LocalInfluxd
from testbed.sysfstree import build_node_tree

S = 1_000_000_000
T0 = 1_790_000_000 * S
H100 = Path(__file__).resolve().parent.parent / "tests/golden/nvml-h100-8gpu/nvml.json"


def stored(server: LocalInfluxd, db: str) -> tuple[int, int]:
    """(points, fields) influxd holds in ``db``: per measurement, the largest field count is
    its points; the sum of counts its fields."""
    points = fields = 0
    names = json.loads(server.query("SHOW MEASUREMENTS", db))["results"][0]["series"][0]
    for (m,) in names["values"]:
        row = json.loads(server.query(f'SELECT count(*) FROM "{m}"', db))
        counts = [v for v in row["results"][0]["series"][0]["values"][0][1:] if v]
        points += max(counts)
        fields += sum(counts)
    return points, fields


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--window-s", type=float, default=10.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir, LocalInfluxd(Path(tmp_dir) / "i") as server:
        tmp = Path(tmp_dir)
        build_node_tree(tmp / "sys")
        (tmp / "agent.toml").write_text(
            f'[agent]\ncluster = "b"\nnode = "n1"\nsysfs = "{tmp}/sys"\nprocfs = "/proc"\n'
            f'reporter_listen = ""\nsources = ["nvml", "infiniband", "power", "thermal"]\n'
            f'[nvml]\nbackend = "recorded"\nrecording = "{H100}"\nloop = true\n'
            'events = "poll"\njobmap_dir = ""\n'
        )
        config = load_config(tmp / "agent.toml", environ={})
        sinks = {}
        for kind in ("raw", "aggregated"):
            server.create_database(kind)
            sinks[kind] = InfluxSink(SinkConfig(url=server.url, database=kind,
                                                spool_dir=str(tmp / f"spool-{kind}")))  # fmt: skip
        raw = sinks["raw"]
        aggregated = AggregatingSink(sinks["aggregated"], args.window_s)
        agent, _ = agent_cli.build_agent(config, raw)
        for cycle in range(args.cycles):
            points = agent.collect(T0 + cycle * S)
            raw.write_points(points)
            aggregated.write_points(points)
        assert raw.close(120) and aggregated.close(120)
        result = {kind: stored(server, kind) for kind in sinks}
    for kind, (points, fields) in result.items():
        print(f"{kind:>10}: {points / args.cycles:7.1f} points/s, {fields / args.cycles:8.1f} "
              f"fields/s per node (8 GPUs, 8 HCAs; SIMULATED readings)")  # fmt: skip
    print(f"points_ratio={result['raw'][0] / result['aggregated'][0]:.2f}")
    print(f"ingest_ratio={result['raw'][1] / result['aggregated'][1]:.2f}")


if __name__ == "__main__":
    main()

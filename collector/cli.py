"""``gpuwarden agent``: the node agent.

    gpuwarden agent --config /etc/gpuwarden/agent.toml          # run (systemd, DaemonSet)
    gpuwarden agent --once                                      # print one cycle, send nothing
                                                                # (exit 1 if a source failed)
    gpuwarden agent --record /var/tmp/trace --cycles 360        # record what it would send
    gpuwarden agent --print --cycles 3 --record-nvml nvml.json  # a GPU's NVML answers, as a
                                                                # golden case (no store needed)
    gpuwarden agent --config agent.toml --print-config          # effective settings as TOML

Settings come from the TOML file, then ``GPUWARDEN_<SECTION>_<KEY>`` environment variables
(see ``config/agent.sample.toml``). SIGTERM or SIGINT stops the loop and flushes the sink.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import socket
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from gpuwarden.collector import sources
from gpuwarden.collector.agent import Agent, LinePrinter, PointSink, SourceHealth, TraceRecorder
from gpuwarden.collector.config import AgentConfig, ConfigError, load_config
from gpuwarden.collector.health import HealthGate
from gpuwarden.collector.nvml.recorded import Recorder
from gpuwarden.collector.relay import ReporterRelay
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.core.cli import UsageError, add_common, config_path, configure_logging
from gpuwarden.core.config import check_secrets
from gpuwarden.core.errors import GpuwardenError
from gpuwarden.core.finding import Finding
from gpuwarden.core.poster import FindingPoster
from gpuwarden.core.signals import stop_event
from gpuwarden.core.store.lineprotocol import Point
from gpuwarden.core.store.sink import InfluxSink

log = logging.getLogger("gpuwarden.agent")


def build_context(config: AgentConfig) -> SourceContext:
    a = config["agent"]
    return SourceContext(
        cluster=a["cluster"],
        node=a["node"] or socket.gethostname(),
        sysfs=Path(a["sysfs"]),
        procfs=Path(a["procfs"]),
        kmsg=Path(a["kmsg"]),
        kernel_journal=a["kernel_journal"],
    )


def build_agent(
    config: AgentConfig,
    sink: PointSink,
    sink_stats: Any = None,
    nvml: Any = None,
    context: SourceContext | None = None,
    outbox: bool = False,
) -> tuple[Agent, FindingPoster | None]:
    """The agent and its fast-path poster; ``nvml`` replaces the configured NVML backend;
    ``context``: the sources' (default: :func:`build_context`'s); ``outbox``: the agent that
    writes to InfluxDB (not ``--once``, ``--print`` or ``--record``): critical findings wait
    on disk beside the spool until the engine has them, and the kernel journal's cursor is
    saved (the others leave the running agent's alone)."""
    context = context or build_context(config)
    a = config["agent"]
    made = []
    for name in a["sources"]:
        settings = config.source_settings(name)
        if name == "nvml" and nvml is not None:
            settings["backend_instance"] = nvml
        made.append(sources.create(name, context, settings))
    if a["write_every_s"] > 0:  # collect every interval_s, write once per window
        from gpuwarden.collector.aggregate import AggregatingSink

        if a["write_every_s"] < a["interval_s"]:
            raise ConfigError("[agent] write_every_s must be 0 or at least interval_s")
        sink = AggregatingSink(sink, float(a["write_every_s"]))
    agent = Agent(
        made,
        sink,
        cluster=context.cluster,
        node=context.node,
        interval_s=a["interval_s"],
        source_timeout_s=a["source_timeout_s"],
        sink_stats=sink_stats,
        commit=outbox,  # the agent that writes to InfluxDB keeps its place in the kernel log
    )
    poster = config.fast_path_poster(context.node, outbox=outbox)
    h = config["health"]
    if h["healthy_after_s"] < 0 or h["expected_gpus"] < 0:
        raise ConfigError("[health] healthy_after_s and expected_gpus must be 0 or more")
    if h["reannounce_s"] and not h["reannounce_s"] >= max(h["healthy_after_s"], 1.0):
        raise ConfigError("[health] reannounce_s must be 0 (once) or at least healthy_after_s")
    gate: HealthGate | None = None

    def emit(finding: Finding) -> None:
        if gate is not None:
            gate.observe(finding)
        agent.add_finding(finding)
        if poster is not None:
            poster.post(finding)

    if h["healthy_after_s"] > 0:
        check = None
        if h["check_probes"]:
            from gpuwarden.collector import check as node_check

            probes = list(h["check_probes"])
            unknown = sorted(set(probes) - set(node_check.PROBES))
            if unknown:
                raise ConfigError(f"[health] check_probes: unknown {unknown}")

            def check(now_ns: int) -> Finding:
                results = node_check.run_checks(config, probes, strict=True)
                return node_check.check_finding(context.cluster, context.node, results, now_ns)

        gate = HealthGate(
            context.cluster,
            context.node,
            emit,
            healthy_after_s=float(h["healthy_after_s"]),
            expected_gpus=int(h["expected_gpus"]),
            check=check,
            restart_on=list(h["restart_on"]),
            reannounce_s=float(h["reannounce_s"]),
        )
    for finding in poster.resumed if poster is not None else []:
        # what an earlier run kept undelivered (the outbox) is this node's news too: a fatal
        # XID there ends the healthy stretch, and its point is written again
        if gate is not None:
            gate.observe(finding)
        agent.add_finding(finding)
    hooks = [gate.cycle] if gate is not None else []
    if h["gpu_count_check"]:
        from gpuwarden.collector.gpucount import GpuCountWatch

        watch = GpuCountWatch(
            context.cluster,
            context.node,
            emit,
            sysfs=a["sysfs"],
            expected=int(h["expected_gpus"]),
            nvml="nvml" in a["sources"],
        )
        hooks.append(watch.cycle)
    if hooks:

        def on_cycle(now_ns: int, points: list[Point]) -> None:
            for hook in hooks:
                hook(now_ns, points)

        agent.on_cycle = on_cycle
    context.emit_finding = emit
    return agent, poster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuwarden agent", description=__doc__.split("\n")[0])
    add_common(parser, config_help="TOML file (default: built-in defaults)")
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one cycle as line protocol; exit 1 if any source failed (a node check)",
    )
    parser.add_argument("--record", metavar="DIR", help="record to a trace instead of sending")
    parser.add_argument(
        "--print",
        action="store_true",
        help="print line protocol instead of sending (with --cycles: a run that needs no store)",
    )
    parser.add_argument("--cycles", type=int, help="stop after N cycles")
    parser.add_argument(
        "--record-nvml",
        metavar="FILE",
        help="also save every NVML answer of the run as a gpuwarden-nvml/1 recording "
        "(on a GPU machine: a real fixture for tests)",
    )
    parser.add_argument("--print-config", action="store_true")
    args = parser.parse_args(argv)
    configure_logging(args)
    try:
        config = load_config(config_path(args))
        if args.print_config:
            _print_config(config)
            return 0
        check_secrets(config.sections)  # every secret file, now: not at the first fatal event
        return _run(config, args)
    except (GpuwardenError, UsageError) as exc:
        print(f"gpuwarden agent: {exc}", file=sys.stderr)
        return 2


def _run(config: AgentConfig, args: argparse.Namespace) -> int:
    relay = None
    influx: InfluxSink | None = None
    sink: PointSink
    if args.once or args.print:
        sink = LinePrinter(sys.stdout.write)
    elif args.record:
        sink = TraceRecorder(args.record, f"recorded by gpuwarden agent on {socket.gethostname()}",
                             simulated=config["nvml"]["backend"] == "recorded")  # fmt: skip
    else:
        influx = InfluxSink(config.sink)
        sink = influx
    recorder = None
    if args.record_nvml:
        recorder = _nvml_recorder(config)
    context = build_context(config)
    agent, poster = build_agent(
        config,
        sink,
        (lambda: influx.stats().fields()) if influx else None,
        recorder,
        context,
        outbox=influx is not None,
    )
    a = config["agent"]
    if influx is not None and (a["reporter_listen"] or a["reporter_socket"]):
        tls = None
        if a["reporter_tls_cert_file"]:
            from gpuwarden.core.tls import server_context

            tls = server_context(a["reporter_tls_cert_file"], a["reporter_tls_key_file"])
        # the jobs on this node's GPUs, as the NVML source attributes them (none: any job)
        jobs_here = context.inventory.jobs.jobs_seen if "nvml" in a["sources"] else None
        pods_named = context.inventory.jobs.pods_named if "nvml" in a["sources"] else None
        relay = ReporterRelay(
            a["reporter_listen"],
            influx,
            tls,
            cluster=context.cluster,
            node=context.node,
            socket_path=a["reporter_socket"],
            procfs=a["procfs"],
            jobs_here=jobs_here,
            pods_named=pods_named,
            lines_per_s=float(a["reporter_lines_per_s"]),
        )
        relay.start()
        agent.self_reports.append(partial(relay.stats_point, agent.cluster, agent.node))
    metrics = None
    if config["agent"]["metrics_listen"] and not args.once:
        from gpuwarden.collector.metrics import agent_metrics
        from gpuwarden.core.metrics import serve_metrics

        stats = (lambda: influx.stats().fields()) if influx else None
        metrics = serve_metrics(
            config["agent"]["metrics_listen"],
            partial(
                agent_metrics, agent, stats, gpu=bool(config["agent"]["metrics_gpu"]), poster=poster
            ),
        )
    probes = None
    if config["agent"]["health_listen"] and not args.once:
        from gpuwarden.collector.probes import serve_probes

        probes = serve_probes(
            config["agent"]["health_listen"],
            agent,
            int(config["agent"]["health_fail_cycles"]),
            (lambda: influx.parked) if influx is not None else (lambda: ""),
        )
    stop = stop_event(signal.SIGTERM, signal.SIGINT)
    log.info("agent: %d sources every %.1fs", len(agent.sources), agent.interval_s)
    try:
        agent.run(stop, max_cycles=1 if args.once else args.cycles)
    finally:
        if metrics is not None:
            metrics.shutdown()
        if probes is not None:
            probes.shutdown()
        if relay is not None:
            relay.close()
        if poster is not None:
            poster.close()
        if recorder is not None:
            recorder.save(args.record_nvml)
            log.info("NVML answers of %d cycles saved to %s", agent.cycles, args.record_nvml)
        if influx is not None:
            s = influx.stats()
            log.info(
                "agent stopped after %d cycles; sink: %d points accepted, %d written, %d dropped, "
                "%d still spooled",
                agent.cycles, s.points_accepted, s.points_written, s.points_dropped, s.spool_points,
            )  # fmt: skip
    if isinstance(sink, LinePrinter) and sink.unencodable:
        log.warning("%d point(s) left out: a name or tag value line protocol cannot carry",
                    sink.unencodable)  # fmt: skip
    if args.once:  # a node check: says how each source did, fails when any did
        print(check_summary(agent.health), file=sys.stderr)
        failed = sorted(name for name, health in agent.health.items() if health.errors)
        if failed:
            print(f"gpuwarden agent: failed in this cycle: {', '.join(failed)} (see the log)",
                  file=sys.stderr)  # fmt: skip
            return 1
    return 0


def check_summary(health: Mapping[str, SourceHealth]) -> str:
    """One line per source after ``--once``: failed (and why), or how many points it gave
    (none: that hardware is absent here, or not where the configuration points)."""
    width = max((len(name) for name in health), default=0)
    lines = ["gpuwarden agent: node check, one cycle"]
    for name, h in health.items():
        if h.failing or h.errors:
            state = f"FAILED  {h.failing or 'see the log'}"
        else:
            state = f"ok      {h.points} points"
            if h.implausible:
                state += f", {h.implausible} impossible reading(s) left out (see the log)"
        lines.append(f"  {name:<{width}}  {state}")
    if any(not h.points and not h.errors for h in health.values()):
        lines.append("  (0 points: nothing to read there, no such hardware or, for xid, no events)")
    return "\n".join(lines)


def _nvml_recorder(config: AgentConfig) -> Recorder:
    import platform

    if config["nvml"]["backend"] == "recorded":
        from gpuwarden.collector.nvml.recorded import RecordedBackend

        inner: Any = RecordedBackend(config["nvml"]["recording"], loop=config["nvml"]["loop"])
    else:
        from gpuwarden.collector.nvml.real import PynvmlBackend

        inner = PynvmlBackend()
    return Recorder(inner, note=f"recorded by gpuwarden agent on {platform.node()}")


def _print_config(config: AgentConfig) -> None:
    """The effective settings as TOML. A secret is never a setting (only the path of its file
    is); a setting that looks like one anyway is not shown."""
    for section, values in config.sections.items():
        print(f"[{section}]")
        for key, value in values.items():
            shown = _toml(value)
            if re.search(r"(password|token|secret)$", key) and value:
                shown = '"(not shown: a secret)"'
            print(f"{key} = {shown}")
        print()


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


if __name__ == "__main__":
    sys.exit(main())

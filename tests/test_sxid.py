"""NVSwitch SXids from the kernel log: events, the fast path, and the default remediation.

The SXid lines are CONSTRUCTED in the driver's format (no real NVSwitch log was available);
the golden case ``sxid-kmsg`` shows the line protocol they become.
"""

from __future__ import annotations

import json

from gpuwarden.collector import sources
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.kmsg import SxidLine, parse_line
from gpuwarden.core.finding import Finding
from gpuwarden.remediation.policy import DEFAULT_POLICIES, first_match, load_policies

FATAL = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 30 sourcetrack timeout"


def test_kmsg_records_and_their_time():
    parsed = parse_line(f"3,9121,86400123456,-;{FATAL}", boot_ns=10**18)
    assert parsed == SxidLine(2, "0000:07:00", 24007, True, 30, FATAL, 10**18 + 86400123456000)
    non_fatal = parse_line("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04")
    assert isinstance(non_fatal, SxidLine) and not non_fatal.fatal and non_fatal.link == 4
    no_link = parse_line("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 11004, Fatal, ingress error")
    assert isinstance(no_link, SxidLine) and no_link.link is None


def test_continuation_and_garbled_lines_are_not_errors():
    for line in (
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, 0x00000000}",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 12028",
    ):
        assert parse_line(line) is None, line


def test_a_fatal_sxid_is_a_node_finding_on_the_fast_path_and_a_default_policy_acts(tmp_path):
    log = tmp_path / "kmsg.log"
    nonfatal = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short"
    log.write_text(f"{nonfatal}\n{FATAL}\n")
    context = SourceContext("c", "node-9", sysfs=tmp_path, procfs=tmp_path)
    found: list[Finding] = []
    context.emit_finding = found.append
    source = sources.create("xid", context, {"path": str(log), "lookback_s": 0.0})
    points = source.collect(1_800_000_000 * 10**9)
    source.close()
    assert [p.tags["severity"] for p in points] == ["warning", "critical"]
    assert [f.kind for f in found] == ["nvswitch_sxid"]  # the non-fatal one raises nothing
    finding = found[0]
    assert finding.subject == {"cluster": "c", "node": "node-9"}  # the node: all its GPUs
    assert finding.evidence["sxid"] == 24007 and finding.evidence["link"] == 30
    policy = first_match(load_policies(DEFAULT_POLICIES), finding)
    assert policy is not None and "drain" in policy.actions


def test_a_fatal_xid_reaches_the_fast_path_between_cycles(tmp_path):
    """The kernel-log follower: with a 30 s collection interval, an XID written after the
    first cycle reaches the engine while the agent has still run only that cycle (the order
    is what is checked, not a time: the poll's limit only guards against a hang)."""
    import threading

    from gpuwarden.collector.cli import build_agent
    from gpuwarden.collector.config import load_config
    from tests.remediation_util import poll
    from tests.scripted_server import Reply, ScriptedServer
    from tests.test_agent import ListSink

    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text("")
    with ScriptedServer([], default=Reply(202)) as engine:
        config = tmp_path / "agent.toml"
        config.write_text(
            f'[agent]\nnode = "n1"\ninterval_s = 30.0\nsources = ["xid"]\nkmsg = "{kmsg}"\n'
            f'remediation_url = "{engine.url}/v1/findings"\n[health]\nhealthy_after_s = 0.0\n'
        )
        agent, poster = build_agent(load_config(config), ListSink())
        stop = threading.Event()
        loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        loop.start()
        poll(lambda: agent.cycles >= 1, 20, "the first cycle")
        with kmsg.open("a") as log:
            log.write("NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU has fallen "
                      "off the bus.\n")  # fmt: skip
        poll(lambda: engine.requests, 20, "the fast path's post")
        assert agent.cycles == 1  # posted between the cycles, not at the next one
        stop.set()
        loop.join(timeout=10)
        agent.close()
        assert poster is not None
        poster.close()
    body = json.loads(engine.bodies()[0])
    assert body["kind"] == "gpu_xid" and body["evidence"]["xid"] == 79

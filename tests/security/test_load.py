"""The exhaustion load test at a small scale (``benchmarks/exhaustion.py``; issue 38, must-show
3): slow and stalled clients, a flooding agent key and, for the relay, hostile times and tags,
beside legitimate senders. The bounds hold and nothing legitimate is lost. CONSTRUCTED traffic
against the real ``remediate serve`` and the agent's relay code in a process of its own."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.exhaustion import MAX_CONNECTIONS, engine_run, relay_run

ARGS = argparse.Namespace(agents=10, slow=150, stalled=20, seconds=12.0)


def test_the_engine_under_attack_serves_every_legitimate_finding(tmp_path: Path) -> None:
    got = engine_run(ARGS, tmp_path)
    assert got["legit_sent"] == ARGS.agents and got["legit_lost"] == 0
    assert got["legit_not_202"] == 0
    assert got["peak_threads"] <= got["thread_bound"]
    assert got["flood_decided"] <= 60  # the agent quota: a minute's worth, at once
    assert got["peak_rss_mib"] - got["idle_rss_mib"] <= MAX_CONNECTIONS  # 128 x 1 MiB


def test_the_relay_under_attack_keeps_every_legitimate_line() -> None:
    got = relay_run(ARGS)
    assert got["hostile_refused"] == 2
    assert got["legit_lines_sent"] == 8000 and got["legit_lines_lost"] == 0
    assert got["legit_requests_refused"] == 0
    assert got["peak_threads"] <= got["thread_bound"]

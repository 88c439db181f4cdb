"""The live loop names no healthy node silent after an InfluxDB outage (CONSTRUCTED timings).

``tests/test_live_loop.py`` stops influxd for 10 s and asserts that only the killed agent is
named ``node_silent``. Once in CI a healthy node was named too: its sink, backing off with full
jitter up to the product's 30 s, sent again only after two analyses (15 s apart) had each seen
it silent for more than the loop's 10 s. This replays that race with the sink's own
:class:`Backoff` and the analyze service's own :class:`Confirmed`, over many random draws.
What it leaves out, each of which makes the rate it finds an upper bound or leaves it as is:
the service's guard that names no node when more than half are silent at once (with four nodes,
one killed, two silent are not more than half), a server's ``Retry-After`` (influxd's restart
sends none), and the request timeout. With any backoff under the analysis interval no node can
be seen silent twice, by the arithmetic; the draws show it, not prove it.
"""

from __future__ import annotations

import random

import pytest

from demo.live import SINK_FLUSH_S, Settings
from gpuwarden.analytics.silence import Confirmed, Silence
from gpuwarden.core.retry import Backoff


def named_silent(
    backoff_max_s: float, every_s: float, silent_after_s: float, rng: random.Random
) -> bool:
    """One outage: the node's last point lands at 0; influxd is back after 10 s plus up to 5 s
    of start-up; the sink's tries are jittered as the sink's; analyses every ``every_s`` from a
    random phase. Whether two analyses running see the node silent (and so name it)."""
    backoff = Backoff(base_s=0.5, max_s=backoff_max_s)
    up = 10.0 + rng.uniform(0, 5)
    t, failed = rng.uniform(0, SINK_FLUSH_S), 0
    while t < up:
        failed += 1
        t += backoff.delay(failed, rng=rng)
    sent = t
    confirmed = Confirmed()
    analysis = rng.uniform(0, every_s)
    while analysis < sent + 2 * every_s:
        if analysis >= up:  # while influxd is down an analysis fails and confirms nothing
            silent = silent_after_s < analysis < sent
            if confirmed([Silence("c", "n", 0, analysis)] if silent else []):
                return True
        analysis += every_s
    return False


def rate(backoff_max_s: float, every_s: float, silent_after_s: float, n: int) -> float:
    rng = random.Random(40)
    return sum(named_silent(backoff_max_s, every_s, silent_after_s, rng) for _ in range(n)) / n


def test_the_live_loops_sink_sends_again_before_a_second_analysis() -> None:
    s = Settings()
    assert rate(s.sink_backoff_max_s, s.analyze_every_s, s.silent_after_s, 20_000) == 0.0


def test_the_products_30_s_backoff_at_the_loops_scale_named_a_healthy_node() -> None:
    """What CI met (the replay can tell): a few outages in a hundred, per node; and the live
    loop's settings now refuse it."""
    s = Settings()
    assert rate(30.0, s.analyze_every_s, s.silent_after_s, 20_000) > 0.01
    with pytest.raises(ValueError, match="must be under analyze_every_s"):
        Settings(sink_backoff_max_s=30.0)

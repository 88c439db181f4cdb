"""The remediation engine: findings in, guarded actions out, every step in the audit log.

One step per module: :mod:`.decide` (which policy, which plan), :mod:`.guard` (whether it runs
now), :mod:`.execute` (running and auditing each action), :mod:`.approve` (plans that wait, and
what operators do with them); :mod:`.engine` puts them together behind :class:`Engine`.

``submit(finding)`` decides at once (under one lock, so two findings never both take the last
node the blast-radius limit allows) and runs the chosen ladder on a small thread pool, so a
checkpoint that takes a minute on one node does not hold up a fatal XID on another.

Guards, in the order they are checked:

1. **de-duplication** by finding id (ids are stable per kind, subject and time bucket; the
   audit log remembers them across restarts): a repeat is answered ``duplicate``, nothing runs;
2. **approval**: a plan with an action kind listed in ``approval`` waits for an operator
   (``approve``), who is notified (and who may overrule the cooldown);
3. **cooldown** per node: a node acted on (by another finding) in the last ``cooldown_s`` gets
   only a notification (putting a repaired node back is exempt: it disrupts nothing);
   and a policy's ``uncordon`` only touches nodes gpuwarden itself took out (``not_ours``
   otherwise: an admin's maintenance drain is the admin's to end);
4. **blast radius**: a plan that would take a node out when ``max_nodes_out`` nodes (or
   ``max_fraction_out`` of the node's partition) are already out (by anyone: the scheduler's
   own view, plus plans in flight) is queued, and a person is told; it runs by itself when
   room frees (``tick``);
5. **rate limit**: at most ``actions_per_minute`` target-changing actions; beyond, queued;
6. **dry-run** (the default): the decision and each action are audited with what would have
   been done; no adapter is asked to change anything.

Every action is idempotent: its id (finding, step, adapter, node, job) is done at most once.

Every window above (cooldown, rate limit, lemon, a waiting plan's expiry) is measured on the
monotonic clock; wall time is only written into records and compared with other hosts'
timestamps (:mod:`remediation.clock`; docs/DURABILITY.md, "Clocks in the engine").
"""

from gpuwarden.remediation.engine.decide import Decision, EngineSettings
from gpuwarden.remediation.engine.engine import Engine, EngineClosedError

__all__ = ["Decision", "Engine", "EngineClosedError", "EngineSettings"]

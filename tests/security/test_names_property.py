"""Issue 38, must-show 2: findings with arbitrary subject strings are refused, or never reach
an argv element that begins with ``-`` nor a path outside its folder.

The subjects are CONSTRUCTED by hypothesis from hostile pieces (option prefixes, ``/``,
``..``, whitespace, control and non-ASCII characters) and arbitrary text. What a finding that
is accepted reaches is computed by the product's own functions: the engine's plan
(:func:`remediation.engine.decide.action_for`), the argv filling both the elastic adapter and
the return check use, and the pid and checkpoint paths."""

from __future__ import annotations

import shlex
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.core.checkpoint import ack_path, interval_path, request_path
from gpuwarden.core.finding import SUBJECT_KEYS, Finding, FindingError, Severity
from gpuwarden.core.names import BadNameError, NodeName, fill_argv, path_inside
from gpuwarden.remediation.engine import EngineSettings
from gpuwarden.remediation.engine.decide import action_for
from gpuwarden.remediation.model import ActionKind

PIECES = ["-", "--", "-o", "ProxyCommand=", "/", "..", ".", " ", "\t", "\n", "\0", "$(id)",
          "`", ";", "*", "~", "é", "+", "_", "gpu", "01", "ns", "A", "\u200b", "\\"]  # fmt: skip
hostile = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), min_size=0, max_size=8
).map("".join)
subjects = st.dictionaries(
    st.sampled_from(SUBJECT_KEYS), st.one_of(hostile, st.text(max_size=300)), min_size=1
)
TEMPLATES = [
    shlex.split("ssh -o BatchMode=yes -- {node} systemctl stop trainer"),
    ["scontrol", "update", "NodeName={node}", "State=DRAIN"],
    ["pdsh", "-w", "{node}", "true"],
]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(subject=subjects)
def test_any_subject_is_refused_or_stays_data(subject: dict[str, str], tmp_path: Path) -> None:
    try:
        finding = Finding("gpu_xid", subject, Severity.CRITICAL, 10**18, summary="CONSTRUCTED")
    except FindingError:
        return  # refused: nothing reaches an argv or a path
    folder = tmp_path.resolve()
    action = action_for(ActionKind.DRAIN, finding, EngineSettings())
    for value in finding.subject.values():
        assert not value.startswith("-") and "\0" not in value
    if action.node:
        node = NodeName(action.node)
        for template in TEMPLATES:
            argv = fill_argv(template, node)
            assert len(argv) == len(template)  # one element per element: no splitting
            for element, was in zip(argv, template, strict=True):
                assert not (element.startswith("-") and not was.startswith("-")), argv
        assert path_inside(folder, node, ".pid").parent == folder
    if action.job:
        for make in (request_path, ack_path, interval_path):
            try:
                path = make(folder, action.job)
            except BadNameError:
                assert "/" in action.job  # a <namespace>/<pod> names no file
                continue
            assert path.parent == folder and path.name.startswith(action.job)

"""Names are data, never code: the one grammar for the names a finding carries.

A node, job, rank or GPU name arrives from the network (a finding, an alert, a relay line) and
may end up in an argv (``ssh -- {node} ...``, ``scontrol update NodeName=...``) or a path
(``<pid_dir>/<node>.pid``, ``<checkpoint_dir>/<job>.interval``). It is parsed once, at the
edge, into a type of its own (:class:`NodeName`, :class:`JobName`, ...); building one of these
*is* parsing (``__new__`` runs the grammar), so every value of such a type is valid, and only
these types are accepted by :func:`fill_argv` and :func:`path_inside`.

The grammar (the union of what Slurm, Kubernetes and torchrun produce, nothing more):

=============  ===============================================================================
``name``       ``[A-Za-z0-9_][A-Za-z0-9._-]*``, at most 253 characters: a hostname or a Slurm
               node name (``gpu-a100-017``, ``node_3``), a Kubernetes node name (a DNS-1123
               subdomain, ``ip-10-0-3-17.ec2.internal``). Never begins with ``-`` (an option to
               any program) or ``.`` (``.``, ``..``, hidden files); no ``/``, no whitespace, no
               control or non-ASCII characters, no shell or glob characters.
node, cluster, switch, hca
               a ``name`` (an HCA is ``mlx5_0``; a switch a topology name or GUID ``0x...``)
job            a ``name`` that may also hold ``+`` (a Slurm job id ``1234``, an array task
               ``1234_5``, a heterogeneous component ``1234+0``, a torchrun run id
               ``gw-test``, a pod UID ``pod-0d4b...``), optionally after one Kubernetes
               namespace: ``<namespace>/<pod>`` (the agent names pods so), the namespace a
               DNS-1123 label (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63). A job with a
               namespace never becomes a path (:func:`path_inside` refuses the ``/``).
rank, port     digits only, at most 9
gpu            digits only (the index, at most 9), or an NVML UUID: ``GPU-`` or ``MIG-``
               followed by hex digits and ``-`` (``GPU-8e3c4e0e-...``)
=============  ===============================================================================

An empty value is not a name: the caller decides whether a subject key may be empty
(:class:`core.finding.Finding` allows it, as it always has; :meth:`Finding.to_point` drops it).

Argv templates (:func:`fill_argv`) replace ``{node}`` within elements, so a filled value is
always one argv element (never a shell string), and :func:`check_argv_template` requires ``--``
before the host of ``ssh`` (the parsed name cannot begin with ``-`` anyway; the ``--`` keeps it
so should a name ever reach ssh unparsed). Paths (:func:`path_inside`) are built from a name
without ``/`` and must resolve inside their folder.

Standard library only: the job-side checkpoint hook imports this through :mod:`core.checkpoint`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Self

from gpuwarden.core.errors import GpuwardenError

MAX_NAME = 253
MAX_NAMESPACE = 63

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_JOB = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,252}")
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DIGITS = re.compile(r"[0-9]{1,9}")
_GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{0,62}")

#: programs whose host argument must follow ``--`` in an argv template
HOST_PROGRAMS = frozenset({"ssh", "autossh", "slogin"})


class BadNameError(GpuwardenError, ValueError):
    """A value that is not a name of its kind; the message says which kind and shows the value
    (``repr``, cut to 80 characters: it may be hostile)."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _full(pattern: re.Pattern[str], value: object) -> bool:
    # fullmatch on a str, ASCII only: str.isascii keeps out look-alike digits and letters
    return isinstance(value, str) and value.isascii() and pattern.fullmatch(value) is not None


class _Name(str):
    """A ``str`` that passed its grammar; subclasses set ``what`` and ``_ok``."""

    __slots__ = ()
    what = "name"

    @staticmethod
    def _ok(value: str) -> bool:
        return _full(_NAME, value)

    def __new__(cls, value: object) -> Self:
        if isinstance(value, cls):
            return value
        if not isinstance(value, str) or not cls._ok(value):
            raise BadNameError(f"not a {cls.what}: {_shown(value)} (see gpuwarden.core.names)")
        return super().__new__(cls, value)


class NodeName(_Name):
    """A node (host) name: Slurm's, Kubernetes', a hostname."""

    __slots__ = ()
    what = "node name"


class ClusterName(_Name):
    __slots__ = ()
    what = "cluster name"


class SwitchName(_Name):
    __slots__ = ()
    what = "switch name"


class HcaName(_Name):
    """An InfiniBand/RoCE adapter (``mlx5_0``)."""

    __slots__ = ()
    what = "HCA name"


class JobName(_Name):
    """A job: a Slurm job id, a torchrun run id, a pod (``<namespace>/<pod>`` or its UID)."""

    __slots__ = ()
    what = "job name"

    @staticmethod
    def _ok(value: str) -> bool:
        namespace, slash, name = value.rpartition("/")
        if slash and not _full(_NAMESPACE, namespace):
            return False
        return _full(_JOB, name)


class Digits(_Name):
    """A rank or a port number: digits only."""

    __slots__ = ()
    what = "number (digits only)"

    @staticmethod
    def _ok(value: str) -> bool:
        return _full(_DIGITS, value)


class GpuName(_Name):
    """A GPU: its index (digits) or its NVML UUID (``GPU-...``, ``MIG-...``)."""

    __slots__ = ()
    what = "GPU (an index or a GPU-/MIG- UUID)"

    @staticmethod
    def _ok(value: str) -> bool:
        return _full(_DIGITS, value) or _full(_GPU_UUID, value)


def parse_node(value: object) -> NodeName:
    return NodeName(value)


def parse_job(value: object) -> JobName:
    return JobName(value)


#: each subject key of a finding (:data:`core.finding.SUBJECT_KEYS`) and its type
SUBJECT_TYPES: Mapping[str, Callable[[object], str]] = {
    "cluster": ClusterName,
    "node": NodeName,
    "gpu": GpuName,
    "hca": HcaName,
    "port": Digits,
    "switch": SwitchName,
    "job": JobName,
    "rank": Digits,
}


def parse_subject(subject: Mapping[str, str]) -> dict[str, str]:
    """Every value parsed into its key's type; an empty value stays ``""`` (no name given).
    Unknown keys are the caller's business (:class:`core.finding.Finding` refuses them)."""
    out: dict[str, str] = {}
    for key, value in subject.items():
        parse = SUBJECT_TYPES.get(key)
        if parse is None or value == "":
            out[key] = value
            continue
        try:
            out[key] = parse(value)
        except BadNameError as exc:
            raise BadNameError(f"subject {key}: {exc}") from None
    return out


# -- argv -------------------------------------------------------------------------------------


class TemplateError(GpuwardenError, ValueError):
    """An argv template that could pass a name to a program as an option."""


def check_argv_template(argv: Sequence[str], setting: str, placeholder: str = "{node}") -> None:
    """Refuse a template where ``ssh`` (or autossh/slogin) gets the host without ``--`` first.

    Why refuse rather than warn: ssh reads any argument that begins with ``-`` before the host
    as an option (``-oProxyCommand=...`` runs a command), and the fix costs the operator two
    characters. Other programs are left as they are: not all of them take ``--`` (``pdsh -w
    {node}``), and the name itself never begins with ``-``.
    """
    program_at = [i for i, a in enumerate(argv) if os.path.basename(a) in HOST_PROGRAMS]
    for at in program_at:
        for i in range(at + 1, len(argv)):
            if argv[i] == "--":
                break
            if argv[i].startswith(placeholder):
                raise TemplateError(
                    f"{setting}: put '--' before {placeholder} for {argv[at]} "
                    f"(e.g. {' '.join([*argv[: at + 1], '--', *argv[i:]])!r}), so that a "
                    "name can never be read as an ssh option"
                )


def fill_argv(argv: Sequence[str], node: NodeName, placeholder: str = "{node}") -> list[str]:
    """The template's elements with ``{node}`` replaced: each element stays one argument."""
    node = NodeName(node)  # a second look costs nothing
    return [a.replace(placeholder, node) for a in argv]


# -- paths ------------------------------------------------------------------------------------


def path_inside(folder: str | Path, name: _Name, suffix: str = "") -> Path:
    """``<folder>/<name><suffix>``, refused unless it resolves inside ``folder``.

    ``name`` must be a parsed name without ``/`` (a job ``<namespace>/<pod>`` is refused here:
    no file is named after it). The folder is resolved (it may itself be a link, chosen by the
    operator); the file may not be a link that leads out of it.
    """
    if not isinstance(name, _Name):
        raise BadNameError(f"path_inside takes a parsed name, got {_shown(name)}")
    leaf = f"{name}{suffix}"
    if "/" in leaf or "\0" in leaf or leaf in (".", "..") or leaf.startswith("."):
        raise BadNameError(f"{_shown(leaf)} cannot name a file in {folder}")
    base = Path(folder).resolve()
    path = base / leaf
    try:
        inside = path.parent == base and path.resolve().is_relative_to(base)
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise BadNameError(f"{path} leads out of {base}")
    return path

"""InfiniBand and RoCE port counters from ``<sysfs>/class/infiniband/<hca>/ports/<n>/``.

Everything is written raw, as the hardware counts it; rates, resets and saturation are handled
downstream (analytics), which is the only place that sees the series over time. Here:

* ``port_xmit_data``/``port_rcv_data`` count 4-byte words; they are written as bytes (x4).
* "N/A (no PMA)" (a port without a performance-management agent), an empty file or garbage
  leaves that field out and is counted in :attr:`InfinibandSource.bad_values`.
* A legacy 32-bit counter sticks at 2**32-1; where ``counters_ext/*_64`` has the same counter
  (mlx4), the 64-bit value is written instead of the stuck one.
* ``state``/``phys_state`` ("4: ACTIVE") become their numeric codes, ``rate`` ("200 Gb/sec
  (4X HDR)") Gb/s, and ``link_layer`` a tag.

**Flaps.** A port that goes down and up again and again is one ``link_flap`` finding (a
warning on the fast path, subject the node, HCA and port), not one per flap: ``flap_count``
link-downs within ``flap_window_s`` raise it, with the count; the port must then stay up for
``flap_recovery_s`` before another burst warns again (:mod:`collector.episodes`). A link-down
is a rise of ``link_downed`` (a counter reset is not one), or, on a port without that counter,
the state leaving ACTIVE.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.sources.base import FileReader, SourceContext, SourceError, parse_int
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point

log = logging.getLogger(__name__)

U32_MAX = 2**32 - 1

# sysfs counter name -> catalogue field; counters/ and hw_counters/ (mlx5) share one table.
COUNTERS: dict[str, str] = {
    "symbol_error": "symbol_error_total",
    "link_error_recovery": "link_error_recovery_total",
    "link_downed": "link_downed_total",
    "port_rcv_errors": "port_rcv_errors_total",
    "port_rcv_remote_physical_errors": "port_rcv_remote_physical_errors_total",
    "port_rcv_switch_relay_errors": "port_rcv_switch_relay_errors_total",
    "port_xmit_discards": "port_xmit_discards_total",
    "port_xmit_constraint_errors": "port_xmit_constraint_errors_total",
    "port_rcv_constraint_errors": "port_rcv_constraint_errors_total",
    "local_link_integrity_errors": "local_link_integrity_errors_total",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors_total",
    "VL15_dropped": "vl15_dropped_total",
    "port_rcv_discards": "port_rcv_discards_total",
    "port_xmit_wait": "port_xmit_wait_total",
    "port_xmit_packets": "port_xmit_packets_total",
    "port_rcv_packets": "port_rcv_packets_total",
    "unicast_xmit_packets": "port_unicast_xmit_packets_total",
    "unicast_rcv_packets": "port_unicast_rcv_packets_total",
    "multicast_xmit_packets": "port_multicast_xmit_packets_total",
    "multicast_rcv_packets": "port_multicast_rcv_packets_total",
    "port_xmit_data": "port_xmit_data_bytes_total",
    "port_rcv_data": "port_rcv_data_bytes_total",
    "np_cnp_sent": "np_cnp_sent_total",
    "rp_cnp_handled": "rp_cnp_handled_total",
    "rp_cnp_ignored": "rp_cnp_ignored_total",
    "np_ecn_marked_roce_packets": "np_ecn_marked_roce_packets_total",
    "out_of_sequence": "out_of_sequence_total",
    "packet_seq_err": "packet_seq_err_total",
    "local_ack_timeout_err": "local_ack_timeout_err_total",
    "implied_nak_seq_err": "implied_nak_seq_err_total",
    "rnr_nak_retry_err": "rnr_nak_retry_err_total",
    "duplicate_request": "duplicate_request_total",
    "req_cqe_error": "req_cqe_error_total",
    "resp_cqe_error": "resp_cqe_error_total",
}
# counters_ext (mlx4): 64-bit versions of counters whose counters/ file may be 32-bit
EXT_COUNTERS: dict[str, str] = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}
WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})


@dataclass(frozen=True)
class Port:
    hca: str
    port: str
    path: str
    counters: tuple[tuple[str, str], ...]  # (counter name, file path), counters/ + hw_counters/
    ext: tuple[tuple[str, str], ...]  # (counters/ name it replaces, counters_ext file path)

    @cached_property
    def plan(self) -> tuple[tuple[str, str, int], ...]:
        """(counter name, catalogue field, multiplier to bytes or 1) of each counter file."""
        return tuple((name, COUNTERS[name], 4 if name in WORD_COUNTERS else 1)
                     for name, _ in self.counters)  # fmt: skip

    @cached_property
    def files(self) -> tuple[str, ...]:
        """Every file :func:`read_port` reads, in the order :func:`parse_port` expects."""
        attrs = tuple(os.path.join(self.path, a) for a in ATTRS)
        return (*(p for _, p in self.counters), *(p for _, p in self.ext), *attrs)


ATTRS = ("state", "phys_state", "rate", "link_layer")


def discover(root: str, hcas: frozenset[str] = frozenset()) -> list[Port]:
    """Every port of every HCA under ``root`` (``<sysfs>/class/infiniband``), sorted."""
    ports: list[Port] = []
    try:
        hca_names = sorted(os.listdir(root))
    except OSError:
        return ports  # no InfiniBand here: no data, not an error
    for hca in hca_names:
        if hcas and hca not in hcas:
            continue
        base = os.path.join(root, hca, "ports")
        try:
            port_names = sorted(os.listdir(base), key=lambda p: (len(p), p))
        except OSError:
            continue
        for port in port_names:
            path = os.path.join(base, port)
            counters = []
            for sub in ("counters", "hw_counters"):
                for name in _listdir(os.path.join(path, sub)):
                    if name in COUNTERS:
                        counters.append((name, os.path.join(path, sub, name)))
            ext = [
                (EXT_COUNTERS[name], os.path.join(path, "counters_ext", name))
                for name in _listdir(os.path.join(path, "counters_ext"))
                if name in EXT_COUNTERS
            ]
            ports.append(Port(hca, port, path, tuple(counters), tuple(ext)))
    return ports


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def read_port(files_of_port: tuple[str, ...], files: FileReader) -> list[bytes | None]:
    """The raw contents of every file of a port (thin: no parsing)."""
    return files.read_many(files_of_port)


def parse_port(port: Port, raw: list[bytes | None]) -> tuple[dict[str, Any], str, int]:
    """Fields, link layer and the number of unusable values of one port (pure)."""
    fields: dict[str, Any] = {}
    bad = 0
    n, n_ext = len(port.counters), len(port.ext)
    ext: dict[str, int | None] = (
        {name: parse_int(raw[n + i]) for i, (name, _) in enumerate(port.ext)} if n_ext else {}
    )
    for (name, field_name, scale), text in zip(port.plan, raw, strict=False):
        if text is None:
            continue
        try:
            value = int(text)  # ignores surrounding whitespace
        except ValueError:  # "N/A (no PMA)", garbage, empty
            bad += 1
            continue
        if value < 0:
            bad += 1
            continue
        if value == U32_MAX and (longer := ext.get(name)) is not None and longer >= 0:
            value = longer  # a 32-bit counter stuck at its maximum: the 64-bit one
        fields[field_name] = value * scale
    for name, wide in ext.items():  # counters_ext alone (no counters/ file) still counts
        if COUNTERS[name] not in fields and wide is not None and wide >= 0:
            fields[COUNTERS[name]] = wide * 4 if name in WORD_COUNTERS else wide
    state, phys, rate, layer_raw = (
        (t.decode("utf-8", "replace") if t is not None else None) for t in raw[n + n_ext :]
    )
    for attr, field_name in ((state, "state_code"), (phys, "phys_state_code")):
        code = parse_int(attr.split(":", 1)[0]) if attr else None
        if code is not None:
            fields[field_name] = code
        elif attr is not None:
            bad += 1
    if rate:
        try:
            fields["rate_gbps"] = float(rate.split()[0])
        except (ValueError, IndexError):
            bad += 1
    return fields, (layer_raw or "").strip(), bad


class InfinibandSource:
    name = "infiniband"

    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.hcas = frozenset(settings.get("hcas", []))
        self.rediscover_cycles = int(settings.get("rediscover_cycles", 60))
        self._root = str(context.sysfs / "class" / "infiniband")
        self._files = FileReader()
        self._ports: list[tuple[Port, tuple[str, ...]]] | None = None
        self._cycles = 0
        self._tags: dict[tuple[str, str, str], dict[str, str]] = {}
        self.bad_values = 0
        try:
            self.flaps = Episodes(
                threshold=int(settings.get("flap_count", 3)),
                window_s=float(settings.get("flap_window_s", 600.0)),
                recovery_s=float(settings.get("flap_recovery_s", 600.0)),
            )
        except ValueError as exc:
            raise SourceError(f"infiniband: {exc}") from None
        self._last: dict[tuple[str, str], tuple[int | None, int | None]] = {}

    def collect(self, now_ns: int) -> list[Point]:
        if self._ports is None or self._cycles % self.rediscover_cycles == 0:
            self._ports = [(p, p.files) for p in discover(self._root, self.hcas)]
            self._files.forget_groups()
            self._files.keep_only({path for _, paths in self._ports for path in paths})
        self._cycles += 1
        points = []
        for port, paths in self._ports:
            fields, layer, bad = parse_port(port, read_port(paths, self._files))
            self.bad_values += bad
            if not fields:
                continue
            key = (port.hca, port.port, layer)
            tags = self._tags.get(key)
            if tags is None:
                tags = self.context.base_tags() | {"hca": port.hca, "port": port.port}
                if layer:
                    tags["link_layer"] = layer
                self._tags[key] = tags
            points.append(Point("ib_port", tags, fields, now_ns))
            self._flaps(port, fields, now_ns)
        return points

    def _flaps(self, port: Port, fields: dict[str, Any], now_ns: int) -> None:
        """Count this cycle's link-downs of ``port``; one finding per burst of flaps."""
        downed, state = fields.get("link_downed_total"), fields.get("state_code")
        last = self._last.get((port.hca, port.port))
        self._last[(port.hca, port.port)] = (downed, state)
        if last is None:
            return
        if downed is not None and last[0] is not None:
            downs = max(0, downed - last[0])  # a reset (a smaller count) is not a flap
        else:
            downs = int(last[1] == 4 and state is not None and state != 4)
        self.flaps.expire(now_ns)
        if not downs:
            return
        episode = self.flaps.event((port.hca, port.port), now_ns, downs)
        if episode is None or self.context.emit_finding is None:
            return
        window_s = self.flaps.window_ns // 10**9
        self.context.emit_finding(
            Finding(
                kind="link_flap",
                subject=self.context.base_tags() | {"hca": port.hca, "port": port.port},
                severity=Severity.WARNING,
                time_ns=now_ns,
                evidence={
                    "flaps": len(episode.recent),
                    "window_s": window_s,
                    "recovery_s": self.flaps.recovery_ns // 10**9,
                    "since_ns": episode.first_ns,
                },
                confidence=1.0,
                summary=f"InfiniBand {port.hca} port {port.port} went down "
                f"{len(episode.recent)} times within {window_s} s",
                source="agent",
            )
        )

    def close(self) -> None:
        self._files.close()

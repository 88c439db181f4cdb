"""The node's measurements beyond its GPUs: the OS and its kernel log, the node check, InfiniBand
ports, power and thermal sensors."""

from __future__ import annotations

from gpuwarden.core.catalogue.schema import (
    IN,
    POWER,
    ST,
    TEMP,
    A,
    B,
    C,
    F,
    G,
    I,
    S,
    _f,
    _m,
)

_ib_counter_names = [
    ("symbol_error_total", "minor link errors (symbol errors) on the physical lane"),
    ("link_error_recovery_total", "successful link error recoveries"),
    ("link_downed_total", "times the link went down after failed recovery"),
    ("port_rcv_errors_total", "received packets with errors"),
    ("port_rcv_remote_physical_errors_total", "received packets marked with EBP"),
    ("port_rcv_switch_relay_errors_total", "received packets discarded for relay errors"),
    ("port_xmit_discards_total", "outbound packets discarded (port down or congestion)"),
    ("port_xmit_constraint_errors_total", "packets not transmitted for constraints"),
    ("port_rcv_constraint_errors_total", "packets received and discarded for constraints"),
    ("local_link_integrity_errors_total", "local physical errors over threshold"),
    ("excessive_buffer_overrun_errors_total", "consecutive flow-control update overruns"),
    ("vl15_dropped_total", "VL15 packets dropped for lack of buffers"),
    ("port_rcv_discards_total", "received packets discarded"),
    ("port_xmit_wait_total", "ticks with data to send but no credits (congestion)"),
    ("port_xmit_packets_total", "packets transmitted"),
    ("port_rcv_packets_total", "packets received"),
    ("port_unicast_xmit_packets_total", "unicast packets transmitted"),
    ("port_unicast_rcv_packets_total", "unicast packets received"),
    ("port_multicast_xmit_packets_total", "multicast packets transmitted"),
    ("port_multicast_rcv_packets_total", "multicast packets received"),
    # hw_counters (mlx5): RoCE congestion control and transport errors
    ("np_cnp_sent_total", "congestion notification packets sent (notification point)"),
    ("rp_cnp_handled_total", "CNPs handled (reaction point)"),
    ("rp_cnp_ignored_total", "CNPs ignored"),
    ("np_ecn_marked_roce_packets_total", "RoCE packets received with ECN marks"),
    ("out_of_sequence_total", "out-of-sequence packets received"),
    ("packet_seq_err_total", "NAK sequence errors received"),
    ("local_ack_timeout_err_total", "local ACK timeouts (retransmissions)"),
    ("implied_nak_seq_err_total", "implied NAK sequence errors"),
    ("rnr_nak_retry_err_total", "RNR NAK retries exceeded"),
    ("duplicate_request_total", "duplicate requests received"),
    ("req_cqe_error_total", "requester completion-queue errors"),
    ("resp_cqe_error_total", "responder completion-queue errors"),
]

_m(
    "os_event",
    A,
    "OS and storage faults from the kernel log (NFS server not responding, Lustre errors, hung "
    "tasks, soft lockups, NVMe errors, OOM kills) and their recoveries; a line that names a "
    "process is tagged with its job",
    (
        *("cluster", "node", "job", "rank", "local_rank"),
        *("event", "severity", "source"),
    ),
    [
        _f("key", S, "", IN, "what the line is about: a server, a Lustre target, a device"),
        _f("message", S, "", IN, "the kernel log line from the rule's match on"),
        _f("pid", I, "", IN, "process named in the line, if any"),
    ],
)
_m(
    "node_os",
    A,
    "The host's own health: tasks blocked in uninterruptible sleep (D state) and the EDAC "
    "memory controllers' error counts",
    ("cluster", "node"),
    [
        _f("procs_blocked_count", I, "", G, "tasks in uninterruptible sleep now (/proc/stat)"),
        _f("edac_ce_total", I, "", C, "corrected memory errors, all memory controllers (EDAC)"),
        _f("edac_ue_total", I, "", C, "uncorrected memory errors, all memory controllers (EDAC)"),
    ],
)
_m(
    "node_check",
    A,
    "gpuwarden check's probes (gpu_count, infiniband, disk, dcgm, gpu_matmul, allreduce), one "
    "point per probe per run: pass, fail or unavailable, and why",
    ("cluster", "node", "probe", "status"),
    [
        _f("passed_active", B, "", ST, "the probe did not fail (pass or unavailable)"),
        _f("duration_s", F, "s", G, "how long the probe took"),
        _f("detail", S, "", IN, "what the probe found, in words"),
    ],
)
_m(
    "ib_port",
    A,
    "InfiniBand/RoCE port counters from sysfs, raw totals as the hardware gives them",
    ("cluster", "node", "hca", "port", "link_layer"),
    [
        *[_f(n, I, "", C, d) for n, d in _ib_counter_names],
        _f("port_xmit_data_bytes_total", I, "B", C, "bytes sent (sysfs counts 4-byte words)"),
        _f("port_rcv_data_bytes_total", I, "B", C, "bytes received (sysfs counts 4-byte words)"),
        _f("state_code", I, "", ST, "logical port state (4 = ACTIVE)"),
        _f("phys_state_code", I, "", ST, "physical port state (5 = LinkUp)"),
        _f("rate_gbps", F, "Gb/s", G, "link rate"),
    ],
)
_m(
    "host_power",
    A,
    "host power domains: RAPL zones and hwmon power/energy sensors",
    ("cluster", "node", "domain", "source"),
    [
        _f("energy_j_total", F, "J", C, "energy counter (RAPL wraps at max_energy_range_uj)"),
        _f("power_w", F, "W", G, "power (hwmon power sensors)", POWER),
    ],
)
_m(
    "thermal",
    A,
    "thermal zones and hwmon temperature sensors",
    ("cluster", "node", "zone", "sensor", "source"),
    [
        _f("temp_c", F, "°C", G, "temperature", TEMP),
        _f("crit_temp_c", F, "°C", G, "critical trip point, where reported"),
    ],
)

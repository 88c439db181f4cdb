"""The docs' measured tables, rendered from the output their commands printed.

Each benchmark's output is kept as it was printed under ``docs/data/<bench>/`` (lines that
start with ``# `` above it say the command, when and on which code it ran); each function here
turns one such output into the Markdown table a page quotes, header and all.
``tests/test_docs_tables.py`` checks that every page holds exactly what these print, so a cell
that disagrees with the recorded output fails there.

    python -m benchmarks.doc_tables verdicts docs/data/verdicts/seeds-8201-8205.txt
"""

from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path


def output(path: Path) -> str:
    """A recorded output without its ``# `` header lines."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# "))


def find(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        raise ValueError(f"the output has no line matching {pattern!r}")
    return match


def rows_under(text: str, header: str) -> list[list[str]]:
    """The ``a | b | c`` rows under the line ``header``, up to the first line that is not one."""
    lines = text.splitlines()
    start = lines.index(header) + 1
    rows = []
    for line in lines[start:]:
        if " | " not in line:
            break
        rows.append([cell.strip() for cell in line.split("|")])
    return rows


def _int(value: str | float) -> str:
    return f"{round(float(value)):,}"


VERDICTS_HEADER = (
    "| arm | removals | wrong | wrong drains | fatal faults seen | missed | missed faults |\n"
    "|---|---|---|---|---|---|---|"
)
VERDICTS_ARMS = {"no-fold": "no-fold (before the split)"}


def verdicts(text: str) -> str:
    """docs/BENCHMARKS.md's verdicts table, from ``benchmarks/verdicts.py``'s output."""
    header = "arm | removals | wrong | wrong % | fatal faults seen | missed | missed % | "
    header += "node down | not removed"
    out = [VERDICTS_HEADER]
    for arm, removals, wrong, wrong_pct, seen, missed, missed_pct, *_ in rows_under(text, header):
        out.append(
            f"| {VERDICTS_ARMS.get(arm, arm)} | {_int(removals)} | {_int(wrong)} | {wrong_pct} % "
            f"| {seen} | {missed} | {missed_pct} % |"
        )
    return "\n".join(out)


def goodput(text: str) -> str:
    """docs/BENCHMARKS.md's fresh-seed goodput table, from ``benchmarks/goodput.py``'s output."""
    out = ["| | reactive | every lever |", "|---|---|---|"]
    for cause, name in [
        ("checkpoint", "checkpoint saves"),
        ("recompute", "recomputation"),
        ("restart", "restarts (and failed starts)"),
    ]:
        row = find(rf"^  {cause}\s+([\d.]+) /\s+([\d.]+)$", text)
        out.append(f"| {name} | {_int(row[1])} | {_int(row[2])} |")
    median = find(r"^median_saved_pct=(\S+)$", text)[1]
    least = find(r"^min_saved_pct=(\S+)$", text)[1]
    out.append(f"| **work saved, median of seeds** | | **{median} %** (min {least} %) |")
    return "\n".join(out)


GOODPUT_SCALE_HEADER = (
    "| job nodes (pool) | job MTBF: every fault / job-stopping (h) | faults / job-stopping / "
    "alerts a week | lost: reactive / every lever (h) | advised interval (s) | saved vs reactive "
    "(min) | vs broken nodes drained | no prediction | no cadence | saves of 10 min | BOUND |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def goodput_scale(text: str) -> str:
    """docs/BENCHMARKS.md's job-size table, from ``benchmarks/goodput_scale.py``'s output."""
    header = find(r"^nodes \| pool \| .*$", text)[0]
    out = [GOODPUT_SCALE_HEADER]
    for cells in rows_under(text, header):
        row = dict(zip(header.split(" | "), cells, strict=True))
        out.append(
            f"| {_int(row['nodes'])} ({_int(row['pool'])}) | {row['MTBF h']} / "
            f"{row['fatal MTBF h']} | {row['faults']} / {row['fatal']} / {row['alerts']} | "
            f"{row['reactive h']} / {row['all h']} | {_int(row['cadence s'])} | "
            f"{row['saved %']} % ({row['min %']}) | {row['vs drain %']} % | "
            f"{row['no-predict %']} % | {row['no-cadence %']} % | {row['@600s %']} % | "
            f"{row['BOUND %']} % |"
        )
    return "\n".join(out)


LIVE_MODEL_HEADER = (
    "| set | predictable failures alerted before onset | leads (s) | sudden failures alerted | "
    "false alarms |\n|---|---|---|---|---|"
)


def live_model(text: str) -> str:
    """docs/LIVE-LOOP.md's fresh-seed model table, from ``benchmarks/live_model.py``'s output."""
    header = "set | seed | faults | predictable caught | leads (s) | sudden caught | false alarms"
    rows = rows_under(text, header)
    out = [LIVE_MODEL_HEADER]
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        faults = sum(len(r[2].split("+")) for r in mine)
        leads = [int(x) for r in mine if r[4] != "-" for x in r[4].split(",")]
        summary = find(
            rf"^{name}: (\d+)/(\d+) predictable failures alerted before onset \(median lead "
            rf"(\d+) s\), (\d+)/(\d+) sudden; (\d+) false alarms of (\d+) alerts",
            text,
        )
        if int(summary[3]) != statistics.median(leads):
            raise ValueError(f"{name}: the summary's median lead is not its rows' median")
        sets = f"{len(mine)} seeds" + (f", {faults} faults" if name != "placed" else "")
        out.append(
            f"| {name} ({sets}) | {summary[1]} / {summary[2]} | median {summary[3]} "
            f"({min(leads)} to {max(leads)}) | {summary[4]} / {summary[5]} | {summary[6]} of "
            f"{summary[7]} alerts |"
        )
    return "\n".join(out)


def _runs(text: str) -> dict[str, list[str]]:
    """The ``== <side> ... run N`` sections of a side-by-side log, by side."""
    runs: dict[str, list[str]] = {}
    for side, body in re.findall(r"^== (\w+).*\n((?:(?!==).*\n?)*)", text, re.MULTILINE):
        runs.setdefault(side, []).append(body)
    return runs


def _span(values: list[float], digits: int) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def agent_cycle(text: str) -> str:
    """docs/BENCHMARKS.md's fixed-cost table, from ``benchmarks/agent_cycle.py``'s output
    (each side run twice, alternating; the log names each run ``== before ...`` or
    ``== after ...``)."""

    def thread(run: str, pattern: str) -> float:
        return sum(
            float(v)
            for v in re.findall(rf"^  thread {pattern}\s+cpu_ms_per_min=\s*(\S+)", run, re.M)
        )

    def field(run: str, pattern: str) -> float:
        return float(find(pattern, run)[1])

    sides = _runs(text)
    before, after = sides["before"], sides["after"]
    rows = [
        (
            "the `kmsg` follower (read `/dev/kmsg` every 0.1 s / asleep in `poll()`)",
            lambda r: thread(r, "kmsg"),
            (0, 1),
        ),
        (
            "HTTP servers and their deadline reapers (woke every 0.5 s / asleep until a client "
            "or a deadline)",
            lambda r: thread(r, r"(?:http-deadlines\S*|relay|probes)"),
            (0, 0),
        ),
        (
            "beyond the cycles and the sending of their points",
            lambda r: field(
                r, r"^idle: beyond the cycles and their sending: cpu_ms_per_min=(\S+);"
            ),
            (0, 1),
        ),
        (
            "the whole process",
            lambda r: field(r, r"^idle: process cpu_ms_per_min=(\S+),"),
            (0, 0),
        ),
    ]
    out = [
        "| CPU ms per minute at interval 10 s | before (57f4727) | after |",
        "|---|---|---|",
    ]
    for name, read, (d_before, d_after) in rows:
        b = _span([read(r) for r in before], d_before)
        a = _span([read(r) for r in after], d_after)
        out.append(f"| {name} | {b} | {a} |")
    for name, pattern in [
        (
            "`idle_cpu_ratio` (process over collect + hand-over)",
            r"^idle_cpu_ratio=(\S+)$",
        ),
        (
            "process over collect + hand-over + send",
            r"process over collect \+ hand-over \+ send: (\S+)$",
        ),
    ]:
        b = ", ".join(find(pattern, r)[1] for r in before)
        a = ", ".join(find(pattern, r)[1] for r in after)
        out.append(f"| {name} | {b} | {a} |")
    return "\n".join(out)


def xid_wait(text: str) -> str:
    """docs/BENCHMARKS.md's table of NVML's event wait at 2 s and 5 s, from
    ``benchmarks/agent_cycle.py``'s idle runs (``== before ...`` / ``== after ...``)."""
    sides = _runs(text)
    before, after = sides["before"], sides["after"]
    out = [
        "| CPU ms per minute at interval 10 s | event wait 2 s (731442d) | 5 s |",
        "|---|---|---|",
    ]
    for name, pattern in [
        ("the `nvml-xid` thread", r"^  thread nvml-xid\s+cpu_ms_per_min=\s*(\S+)$"),
        ("the whole process", r"^idle: process cpu_ms_per_min=(\S+),"),
    ]:
        b = _span([float(find(pattern, r)[1]) for r in before], 2)
        a = _span([float(find(pattern, r)[1]) for r in after], 2)
        out.append(f"| {name} | {b} | {a} |")
    for name, pattern in [
        ("`idle_cpu_ratio` (process over collect + hand-over)", r"^idle_cpu_ratio=(\S+)$"),
        ("process over collect + hand-over + send",
         r"process over collect \+ hand-over \+ send: (\S+)$"),
    ]:  # fmt: skip
        b = ", ".join(find(pattern, r)[1] for r in before)
        a = ", ".join(find(pattern, r)[1] for r in after)
        out.append(f"| {name} | {b} | {a} |")
    return "\n".join(out)


def failover(text: str) -> str:
    """docs/DURABILITY.md's failover table, from ``benchmarks/failover.py``'s output."""
    kills = find(
        r"^plans=(\d+) killed_at_journal_boundary=(\d+) killed_after_plan=(\d+) both_down=(\d+)$",
        text,
    )
    seed = find(r"kill points from seed (\d+)$", text)[1]
    drains = find(r"^drains_per_plan=\[([\d, ]+)\]", text)[1]
    once = "exactly 1, all " + kills[1] if drains == "1" else f"{drains} (not exactly once)"
    times = find(r"^failovers=(\d+) median_s=(\S+) max_s=(\S+)$", text)
    p95 = find(r"^failover_p95_s=(\S+) samples=(\d+)$", text)[1]
    return "\n".join(
        [
            f"| measured (seed {seed}, {kills[1]} plans, this 2-core VM, default `lost_after_s` "
            "10 s, `check_s` 1 s) | value |",
            "|---|---|",
            "| kills at a journal boundary / after a plan / while the other was down too | "
            f"{kills[2]} / {kills[3]} / {kills[4]} |",
            "| drains per plan (audit log; Slurm shows each node drained with gpuwarden's "
            f"reason) | {once} |",
            "| failover, death to the standby's first `/healthz` answer: median, p95, max "
            f"({times[1]} takeovers) | {times[2]} s, {p95} s, {times[3]} s |",
        ]
    )


def serving(text: str) -> str:
    """docs/BENCHMARKS.md's side-by-side serving table, from ``benchmarks/serving.py``'s runs
    kept one after another, each after its ``== run N before|after <code>`` line."""
    rows = ["| run | code | accepted | lost | retried tries | p50 (s) | p99 (s) | relay p99 (s) |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    runs = re.split(r"^== run ", text, flags=re.MULTILINE)[1:]
    if not runs:
        raise ValueError("no '== run' line: not the serving runs")
    for run in runs:
        number, which, code = find(r"\A(\d+) (before|after) (\S+)", run).groups()
        sent = find(r"sent (\d+), accepted (\d+), refused \d+ \{.*\}, gave up \d+, "
                    r"retried tries (\d+), lost (\d+)", run)  # fmt: skip
        latency = find(r"latency p50 (\S+) s, p99 (\S+) s", run)
        relay = find(r"relay \(.*p99 (\S+) s$", run)[1]
        lost = find(r"^findings_lost=(\d+)$", run)[1]
        rows.append(
            f"| {number} | {which} ({code.split('+')[0]}) | {_int(sent[2])} of {_int(sent[1])} "
            f"| {lost} | {_int(sent[3])} | {latency[1]} | {latency[2]} | {relay} |"
        )
    return "\n".join(rows)


def aggregate(text: str) -> str:
    """docs/SCALE.md's fields per node, from ``benchmarks/aggregate.py``'s output."""
    raw, aggregated = (
        float(find(rf"^\s*{kind}: .*?, +([\d.]+) fields/s per node", text)[1])
        for kind in ("raw", "aggregated")
    )
    ratio = find(r"^ingest_ratio=(\S+)$", text)[1]
    return "\n".join(
        [
            "| what a node writes (8 GPUs with NVLink, 8 HCAs) | fields/s | per GPU |",
            "|---|---|---|",
            f"| every reading at 1 Hz | {_int(raw)} | {_int(raw / 8)} |",
            f"| the same with `[agent] write_every_s = 10` ({ratio}x fewer) | {_int(aggregated)} "
            f"| {_int(aggregated / 8)} |",
        ]
    )


def _part(text: str, pattern: str, part: str) -> re.Match[str] | str:
    """The match of ``pattern`` in a ``benchmarks/nvml_calls.py`` output, or what its ``part``
    said when it failed (``<part>: failed: <error>``): a cell then says so."""
    match = re.search(pattern, text, re.MULTILINE)
    if match is not None:
        return match
    return f"failed: {find(rf'^{part}: failed: (.*)$', text)[1]}"


def nvml_calls(text: str) -> str:
    """docs/NVML-REAL.md's table of single NVML calls, from ``benchmarks/nvml_calls.py``'s
    output (median wall ms of its repetitions, GPU 0)."""
    agent = _part(text, r"^agent field request \((\d+) fields\): ([\d.]+) ms$", "per_field")
    fields = {
        int(f): float(ms) for f, ms in re.findall(r"^  field +(\d+): +([\d.]+) ms", text, re.M)
    }
    pcie = _part(text, r"^pcie throughput: one call ([\d.]+) ms; TX then RX ([\d.]+) ms; "
                 r"TX and RX on two threads ([\d.]+) ms$", "pcie")  # fmt: skip
    energy = _part(text, r"^nvmlDeviceGetTotalEnergyConsumption: ([\d.]+) ms", "energy")
    one, seq, par = (pcie, pcie, pcie) if isinstance(pcie, str) else pcie.groups()
    stopped = re.search(r"^per_field: failed: (.*)$", text, re.MULTILINE)  # at once or midway
    fields_said = f"failed: {stopped[1]}" if stopped else "not printed"
    count, whole = ("?", agent) if isinstance(agent, str) else agent.groups()
    field_83 = f"{fields[83]:.3f}" if 83 in fields else fields_said
    others = [ms for f, ms in fields.items() if f != 83]
    return "\n".join(
        [
            "| call | wall ms |",
            "|---|---|",
            f"| `nvmlDeviceGetPcieThroughput` (one direction) | **{one}** |",
            f"| TX then RX | {seq} |",
            f"| TX and RX on two threads | {par} |",
            f"| field 83, total energy (alone) | {field_83} |",
            f"| `nvmlDeviceGetTotalEnergyConsumption` | "
            f"{energy if isinstance(energy, str) else energy[1]} |",
            f"| the agent's whole field request ({count} fields) | {whole} |",
            f"| any other field, alone ({len(others)} of them) | "
            f"{_span(others, 3) if others else fields_said} |",
        ]
    )


#: each line of ``benchmarks/nvml_real.py``'s output the table shows: (its row, wall in bold)
NVML_REAL_ROWS = {
    "nvml_source_real_in_turn_baseline": (
        "NVML source, the PCIe samples asked in turn (the baseline: the agent before)",
        False,
    ),
    "nvml_source_real": ("NVML source, the PCIe samples at once", True),
    "nvml_source_recorded": ("NVML source on the recording of the same GPU (no driver)", False),
    "real_full_cycle": ("the agent's whole cycle, every default source", True),
}


def nvml_real(text: str) -> str:
    """docs/NVML-REAL.md's table of collection cycles, from ``benchmarks/nvml_real.py``'s
    output (median block, wall and CPU ms a cycle)."""
    rows = ["| | wall ms | CPU ms |", "|---|---|---|"]
    for label, (row, bold) in NVML_REAL_ROWS.items():
        match = find(rf"^{label}: wall_ms median=([\d.]+) .* cpu_ms median=([\d.]+)$", text)
        wall = f"{float(match[1]):.2f}"
        rows.append(f"| {row} | {f'**{wall}**' if bold else wall} | {float(match[2]):.2f} |")
    return "\n".join(rows)


def scale_runs(text: str) -> dict[int, list[list[str]]]:
    """``benchmarks/scale.py``'s closing table, its rows by GPU count, one per worker count:
    GPUs, workers, analysis s, s per M points, driver MiB, worker MiB, read MiB."""
    runs: dict[int, list[list[str]]] = {}
    for line in text[find(r"^\s*GPUs\s+workers\s+analysis s", text).end() :].splitlines()[1:]:
        cells = line.split()
        if len(cells) != 7:
            break
        runs.setdefault(int(cells[0].replace(",", "")), []).append(cells)
    return runs


def scale(text: str) -> str:
    """docs/SCALE.md's table, from ``benchmarks/scale.py``'s output: for each size, what was
    loaded and how fast influxd took it, then the analysis with each worker count (the last
    worker count's cost per point and bytes read, the higher peak of the runs)."""
    loads = {
        int(g.replace(",", "")): (points, rate)
        for g, points, rate in re.findall(
            r"^SIMULATED ([\d,]+) GPUs .*?: ([\d,]+) points, .*?\(([\d,]+) fields/s into influxd",
            text,
            re.MULTILINE,
        )
    }
    runs = scale_runs(text)
    if not runs or set(runs) != set(loads):
        raise ValueError("not benchmarks/scale.py's output: no load line or table for a size")
    counts = [r[1] for r in next(iter(runs.values()))]
    plural = {n: "worker" if n == "1" else "workers" for n in counts}
    last = counts[-1]
    out = [
        "| GPUs | points | load into influxd | "
        + " | ".join(f"{n} {plural[n]}" for n in counts)
        + f" | s per M points ({last} {plural[last]}) | driver peak | worker peak | read |",
        "|---" * (len(counts) + 7) + "|",
    ]
    for gpus, rows in sorted(runs.items()):
        points, rate = loads[gpus]
        per_m, read = rows[-1][3], rows[-1][6]
        driver, worker = (max(float(r[i]) for r in rows) for i in (4, 5))  # either run's
        times = " | ".join(f"{r[2]} s" for r in rows)
        out.append(
            f"| {gpus:,} | {points} | {rate} fields/s | {times} | {per_m} | {_int(driver)} MiB "
            f"| {_int(worker)} MiB | {_int(read)} MiB |"
        )
    return "\n".join(out)


TABLES: dict[str, Callable[[str], str]] = {
    "verdicts": verdicts,
    "goodput": goodput,
    "goodput_scale": goodput_scale,
    "live_model": live_model,
    "agent_cycle": agent_cycle,
    "xid_wait": xid_wait,
    "failover": failover,
    "serving": serving,
    "scale": scale,
    "aggregate": aggregate,
    "nvml_calls": nvml_calls,
    "nvml_real": nvml_real,
}


#: tables that hold REAL measurements only, and the line of the output that says REAL (the
#: same benchmarks run in CI over a stand-in library and say CONSTRUCTED there)
REAL_ONLY = {
    "nvml_calls": r"^device: .*; REAL$",
    "nvml_real": r"^input: REAL ",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in TABLES:
        print(
            f"usage: python -m benchmarks.doc_tables {{{','.join(TABLES)}}} OUTPUT", file=sys.stderr
        )
        return 2
    text = output(Path(args[1]))
    real = REAL_ONLY.get(args[0])
    if real is not None and not re.search(real, text, re.MULTILINE):
        print(f"{args[1]}: the output does not say REAL (no line matching {real!r}); a "
              f"{args[0]} table holds a GPU's times only", file=sys.stderr)  # fmt: skip
        return 1
    print(TABLES[args[0]](text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The live loop's per-seed table (docs/LIVE-LOOP.md), from the summaries ``gpuwarden demo``
printed: one row per seed, both arms' step logs and work lost, work saved and the XID-to-DRAIN
delays. The summaries are kept as they were printed (``docs/data/live-loop/seed-<N>.txt``);
``tests/test_docs_live_loop.py`` checks that the page's table is what this prints from them.

    python -m demo.live_table docs/data/live-loop/seed-520?.txt

A kept summary may start with ``# `` lines saying how it was made; they are not read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HEADER = (
    "| seed | reactive: job (its step log) | reactive: lost GPU-h | proactive: job (its step "
    "log) | proactive: lost GPU-h | work saved | XID to DRAIN (s) |\n"
    "|---|---|---|---|---|---|---|"
)


def row(summary: str) -> str:
    """One table row from one ``gpuwarden demo`` summary."""
    seed = re.search(r"\(seed (\d+)\)", summary)
    arms = re.split(r"^(reactive|proactive) \(", summary, flags=re.MULTILINE)
    jobs, lost = {}, {}
    for name, text in zip(arms[1::2], arms[2::2], strict=True):
        job = re.search(r"^  job \(its step log\)\s+(.+)$", text, re.MULTILINE)
        gpu_h = re.search(r"^  work lost\s+([\d.]+) GPU-h \((\d+) s", text, re.MULTILINE)
        if job is None or gpu_h is None:
            raise ValueError(f"the {name} arm's summary has no step log or work lost")
        jobs[name] = job[1].replace(";", ",")
        lost[name] = f"{gpu_h[1]} ({gpu_h[2]} s)"
    saved = re.search(r"^work_saved_pct=(\S+)$", summary, re.MULTILINE)
    drains = re.search(r"^XID line to Slurm DRAIN \(proactive\): (.+)$", summary, re.MULTILINE)
    if seed is None or saved is None or drains is None:
        raise ValueError("not a gpuwarden demo summary (no seed, work_saved_pct or XID line)")
    delays = drains[1].replace(" s", "")
    return (
        f"| {seed[1]} | {jobs['reactive']} | {lost['reactive']} | {jobs['proactive']} | "
        f"{lost['proactive']} | {saved[1]} % | {delays} |"
    )


def table(paths: list[Path]) -> str:
    summaries = (p.read_text(encoding="utf-8") for p in paths)
    return "\n".join([HEADER, *(row(_without_header(text)) for text in summaries)])


def _without_header(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("# "))


def main(argv: list[str] | None = None) -> int:
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m demo.live_table SUMMARY...", file=sys.stderr)
        return 2
    print(table(sorted(paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

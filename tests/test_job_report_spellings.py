"""How real jobs spell what the Reporter asks, found by a review against real launchers and
job code (2026-11-28). The environments and shapes are CONSTRUCTED, in the launchers' and
torch's own spellings.
"""

from __future__ import annotations

import pytest

from gpuwarden.analytics.mfu import canonical_dtype, peak_flops
from gpuwarden.collector.attribution import parse_environ, rank_from_environ
from gpuwarden.collector.jobside.reporter import Reporter


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({"RANK": "5"}, 5),  # torchrun
        ({"SLURM_PROCID": "6"}, 6),  # srun
        ({"OMPI_COMM_WORLD_RANK": "7"}, 7),  # Open MPI's mpirun
        ({"PMI_RANK": "8"}, 8),  # MPICH, Intel MPI
        ({"PMIX_RANK": "9"}, 9),  # PMIx launchers
        ({"RANK": "3", "OMPI_COMM_WORLD_RANK": "7"}, 3),  # torchrun's own first
        ({"RANK": "x", "PMI_RANK": "2"}, 2),  # not a rank: the next launcher's
        ({"RANK": "\u00b2", "PMI_RANK": "2"}, 2),  # a digit to str.isdigit, not a rank
        ({"RANK": "007"}, 7),
        # sbatch + mpirun: every process inherits the batch step's SLURM_PROCID=0 (found by
        # the review of the first version, which read SLURM_PROCID before the MPI ranks)
        ({"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "5"}, 5),
        ({}, 0),
    ],
)
def test_each_launchers_rank_is_the_ranks(env: dict[str, str], rank: int) -> None:
    """Before: RANK or SLURM_PROCID only, so under mpirun every process reported rank 0 and
    analytics read their steps as restarts of one rank (MFU 0.63 reported as 0.08). The agent
    reads a GPU process's rank the same way."""
    assert int(rank_from_environ(env) or 0) == rank
    got = parse_environ(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    assert got.rank == (str(rank) if env else "")  # as the reporter tags it: "7", not "007"


def test_the_reporter_takes_its_rank_from_mpirun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "11")
    assert Reporter("j", url="http://127.0.0.1:9").rank == 11


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [("BF16", "bf16"), ("bfloat16", "bf16"), ("torch.bfloat16", "bf16"),
     ("torch.float16", "fp16"), ("half", "fp16"), ("fp8_e4m3", "fp8"),
     ("float8_e4m3fn", "fp8"), ("bf16", "bf16"), ("amp", "amp")],
)  # fmt: skip
def test_a_dtype_in_torchs_or_any_case_is_the_tables(spelling: str, dtype: str) -> None:
    """Before: "BF16" or "torch.bfloat16" got no MFU at all ("no peak for dtype")."""
    assert canonical_dtype(spelling) == dtype
    if dtype != "amp":  # not a precision: still no peak, and said so
        assert peak_flops("NVIDIA H100 80GB HBM3", spelling) == peak_flops(
            "NVIDIA H100 80GB HBM3", dtype
        )
    # an operator's table in any spelling too
    assert peak_flops("NVIDIA H100", spelling, {"H100": {"BFloat16": 900, "fp16": 900,
                                                         "fp8": 1800, "amp": 1}}) > 0  # fmt: skip

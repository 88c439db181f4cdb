"""The environment a Kubernetes pod's process sees, for the job-side reporter's tests: the
service account's namespace file, ``KUBERNETES_SERVICE_HOST``, a hostname, and torchrun's run
id (what the reporter must not take for the job's name in a pod)."""

from __future__ import annotations

from pathlib import Path

import pytest


def in_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, namespace: str = "train") -> None:
    """Pod ``llama-0`` in ``namespace``, under torchrun (run id ``llama-run``), with none of
    the variables that name a job otherwise."""
    from gpuwarden.collector.jobside import reporter

    mounted = tmp_path / "namespace"
    mounted.write_text(f"{namespace}\n")
    monkeypatch.setattr(reporter, "SERVICE_ACCOUNT_NAMESPACE", str(mounted))
    for key in ("SLURM_JOB_ID", "GPUWARDEN_JOB", "POD_NAME", "POD_NAMESPACE",
                "JOB_COMPLETION_INDEX"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "llama-0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "llama-run")

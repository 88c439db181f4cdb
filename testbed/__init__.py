"""Real local servers and faithful fakes, started by tests, benchmarks and the demo.

Real: :mod:`.influxd` (Debian's influxd on loopback), :mod:`.slurm` (slurmctld and several
slurmd on loopback), the example training jobs in :mod:`.jobs` (real PyTorch, gloo, CPU).
Fakes where nothing real can run here, behind the same interface the product uses: a
Kubernetes API server (:mod:`.k8s`), a kubelet's pod-resources endpoint (:mod:`.kubelet`),
the NVML stand-in library and the recording makers (:mod:`.nvml`), a sysfs tree builder
(:mod:`.sysfstree`) and an in-memory scheduler adapter (:mod:`.scheduler`).

Product code never imports this package.
"""

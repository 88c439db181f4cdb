"""Where each simulated job runs over time, and the steps it reports (``job_step``).

A job is placed on the first free nodes and walks through the fatal faults that hit it: it
runs, stops at the fault, and restarts after ``restart_s`` from its last checkpoint (step_index
rolls back), on a spare node if the failed one is still down; a hang holds the GPUs with no
progress until it ends. Between fault boundaries every rank's slowdown is constant, so steps are
generated a piece at a time: a rank's step time is the base time times its slowdown and a
jitter, and a synchronous step lasts as long as the slowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from numpy.typing import NDArray

from gpuwarden.simulation.faulttypes import Fault, Ranks, of
from gpuwarden.simulation.spec import JobSpec, ScenarioSpec

NS = 1_000_000_000
HEARTBEAT_S = 30.0
"""The training-side reporter's default heartbeat interval."""


@dataclass
class Run:
    """A stretch of time a job runs on a fixed set of nodes."""

    start_s: float
    end_s: float
    nodes: list[int]
    hung: bool = False  # the job holds its GPUs but makes no progress (NCCL hang)


@dataclass
class JobPlan:
    spec: JobSpec
    runs: list[Run] = field(default_factory=list)

    def nodes_at(self, t: float) -> list[int] | None:
        for r in self.runs:
            if r.start_s <= t < r.end_s:
                return r.nodes
        return None


class JobSchedule:
    """The jobs of a scenario against its resolved faults (no randomness but ``steps``'s)."""

    def __init__(
        self,
        spec: ScenarioSpec,
        faults: list[Fault],
        switch_of: list[str],
        node_names: list[str],
    ) -> None:
        self.spec = spec
        self.faults = faults
        self.switch_of = switch_of
        self.node_names = node_names
        self.plans = self._plan()

    def _fatal_for(self, f: Fault, job: str, nodes: list[int]) -> bool:
        return of(f).stops(f, job, nodes)

    def _node_down(self, node: int, t: float) -> bool:
        return any(
            of(f).downs_node(f) and f.node == node and f.onset_s <= t < f.end_s for f in self.faults
        )

    def _plan(self) -> list[JobPlan]:
        """Walk each job through the fatal faults that hit it: run, stop, restart."""
        plans: list[JobPlan] = []
        free = list(range(self.spec.nodes))
        allocated: list[list[int]] = []
        for js in self.spec.jobs:
            allocated.append(free[: js.nodes])
            free = free[js.nodes :]
        spares = list(free)
        end = float(self.spec.duration_s)
        for js, nodes in zip(self.spec.jobs, allocated, strict=True):
            plan = JobPlan(js)
            t = 0.0
            current = list(nodes)
            while t < end:
                hits = [
                    f
                    for f in self.faults
                    if f.onset_s >= t and self._fatal_for(f, js.name, current)
                ]
                stop = min((f.onset_s for f in hits), default=end)
                plan.runs.append(Run(t, stop, list(current)))
                if stop >= end:
                    break
                hit = min(hits, key=lambda f: f.onset_s)
                hung = of(hit).hangs
                if hung:  # stuck until the hang ends, then restarted
                    plan.runs.append(Run(stop, hit.end_s, list(current), hung=True))
                    stop = hit.end_s
                resume = stop if hung else min(end, stop + js.restart_s)
                # Replace nodes still down at restart with spares that are up; else wait.
                for i, node in enumerate(current):
                    if self._node_down(node, resume):
                        up = [s for s in spares if not self._node_down(s, resume)]
                        if up:
                            spares.remove(up[0])
                            spares.append(node)
                            current[i] = up[0]
                        else:
                            repaired = max(
                                f.end_s for f in self.faults if f.fatal and f.node == node
                            )
                            resume = max(resume, repaired)
                t = resume
            plans.append(plan)
        return plans

    # -- job steps ------------------------------------------------------------------------

    def _stages(self, js: JobSpec) -> NDArray[np.int64]:
        """Pipeline stage of every rank, Megatron order: tp fastest, then dp, then pp."""
        world = js.nodes * self.spec.gpus_per_node
        return np.arange(world) // (world // js.pp)

    def ranks(self, js: JobSpec, nodes: list[int]) -> Ranks:
        """The node, GPU and pipeline stage of each rank of ``js`` running on ``nodes``."""
        g = self.spec.gpus_per_node
        return Ranks(
            node=np.repeat(np.array(nodes), g),
            gpu=np.tile(np.arange(g), js.nodes),
            stage=self._stages(js),
        )

    def _rank_factors(self, js: JobSpec, nodes: list[int], t: float) -> NDArray[np.float64]:
        world = js.nodes * self.spec.gpus_per_node
        ranks = self.ranks(js, nodes)
        factor = np.ones(world)
        for f in self.faults:
            if not f.active(t):
                continue
            slowed = of(f).slowdown(f, js.name, ranks, self.switch_of)
            if slowed is not None:
                factor[slowed] += f.severity
        return factor

    def steps(self, rng: np.random.Generator) -> pl.DataFrame:
        """Every reported step of every job (``job_step`` rows), whole scenario at once."""
        frames = []
        for jp in self.plans:
            js = jp.spec
            g = self.spec.gpus_per_node
            world = js.nodes * g
            per_rank_tokens = js.tokens_per_step // world
            bounds = sorted(
                {0.0, float(self.spec.duration_s)}
                | {f.onset_s for f in self.faults}
                | {f.end_s for f in self.faults}
            )
            step = 0
            ckpts: list[tuple[float, int]] = [(0.0, 0)]
            for run in jp.runs:
                if run.end_s <= run.start_s or run.hung:
                    continue
                if run.start_s > 0:  # restart: roll back to the last checkpoint before the stop
                    step = max(s for t_c, s in ckpts if t_c <= run.start_s)
                next_ckpt = run.start_s + js.checkpoint_interval_s
                t = piece_start = run.start_s
                pieces = [b for b in bounds if run.start_s < b < run.end_s] + [run.end_s]
                for b in pieces:
                    # slowdowns are constant between fault boundaries: evaluate at the start
                    factors = self._rank_factors(js, run.nodes, piece_start)
                    piece_start = b
                    slowest = float(factors.max())
                    est = int((b - t) / (js.step_time_s * slowest)) + 2
                    jit = rng.normal(0.0, js.step_jitter_ratio, (est, world))
                    rank_times = js.step_time_s * factors[None, :] * (1.0 + np.abs(jit))
                    wall = rank_times.max(axis=1)
                    ends = t + np.cumsum(wall)
                    k = int(np.searchsorted(ends, b, side="right"))
                    if k:
                        idx = step + 1 + np.arange(k)
                        keep = idx % js.report_every_steps == 0
                        if keep.any():
                            frames.append(
                                self._step_rows(
                                    jp,
                                    run.nodes,
                                    ends[:k][keep],
                                    idx[keep],
                                    rank_times[:k][keep],
                                    per_rank_tokens,
                                )
                            )
                        step += k
                        t = float(ends[k - 1])
                        while next_ckpt <= t:
                            done = idx[ends[:k] <= next_ckpt]
                            ckpts.append((next_ckpt, int(done[-1]) if done.size else step - k))
                            next_ckpt += js.checkpoint_interval_s
                    t = max(t, b) if k == 0 else t
                # the partial step in flight at the stop is lost, as in a real failure
        if not frames:
            return self._empty_steps()
        return pl.concat(frames).sort("time")

    def _step_rows(
        self,
        jp: JobPlan,
        nodes: list[int],
        ends: NDArray[np.float64],
        idx: NDArray[np.int64],
        times: NDArray[np.float64],
        tokens: int,
    ) -> pl.DataFrame:
        js = jp.spec
        world = times.shape[1]
        g = self.spec.gpus_per_node
        node_names = np.array([self.node_names[n] for n in nodes])
        n_steps = len(idx)
        return pl.DataFrame(
            {
                "time": np.repeat(self.spec.start_ns + (ends * NS).astype(np.int64), world),
                "cluster": self.spec.cluster,
                "node": np.tile(np.repeat(node_names, g), n_steps),
                "job": js.name,
                "rank": np.tile(np.arange(world).astype(str), n_steps),
                "step_index": np.repeat(idx.astype(np.int64), world),
                "step_time_s": times.reshape(-1).round(4),
                "tokens_count": np.full(n_steps * world, tokens, dtype=np.int64),
                "samples_count": np.full(
                    n_steps * world, max(1, tokens // js.seq_len_tokens), dtype=np.int64
                ),
            }
        )

    def heartbeats(self, steps: pl.DataFrame, every_s: float = HEARTBEAT_S) -> pl.DataFrame:
        """Every rank's ``job_heartbeat`` every ``every_s`` while its job holds its nodes (hung
        or not), as the reporter's thread sends them: the last step and the time since it,
        and whether the rank is inside a step. It always is (steps follow each other), but
        in a hang the culprit rank (the fault's node and GPU) waits between steps."""
        g = self.spec.gpus_per_node
        frames = []
        for jp in self.plans:
            js, world = jp.spec, jp.spec.nodes * g
            # each step once (ranks end a synchronous step together; a restart repeats indices)
            done = (
                steps.filter(pl.col("job") == js.name)
                .select("time", "step_index")
                .unique()
                .sort("time")
            )
            # a sentinel step before time began, so every tick has a "last step"
            st_t = np.concatenate([[np.iinfo(np.int64).min], done["time"].to_numpy()])
            st_i = np.concatenate([[-1], done["step_index"].to_numpy()])
            born = 0.0  # when the job's processes started (a hang keeps the same ones)
            for run in jp.runs:
                born = born if run.hung else run.start_s
                ticks = np.arange(np.ceil(run.start_s / every_s) * every_s, run.end_s, every_s)
                if not ticks.size:
                    continue
                t_ns = self.spec.start_ns + (ticks * NS).astype(np.int64)
                k = np.searchsorted(st_t, t_ns, side="right") - 1
                born_ns = self.spec.start_ns + int(born * NS)
                stepped = st_t[k] >= born_ns  # this process has reported a step
                last_ns = np.where(stepped, st_t[k], born_ns)
                in_step = np.ones(world, dtype=bool)
                culprit = self._hang_culprit(js.name, run)
                if culprit is not None:
                    in_step[culprit] = False
                names = np.repeat(np.array([self.node_names[x] for x in run.nodes]), g)
                n = len(ticks)
                frame = pl.DataFrame(
                    {
                        "time": np.repeat(t_ns, world),
                        "cluster": self.spec.cluster,
                        "node": np.tile(names, n),
                        "job": js.name,
                        "rank": np.tile(np.arange(world).astype(str), n),
                        "step_index": np.repeat(np.where(stepped, st_i[k], -1), world),
                        "since_step_s": np.repeat(((t_ns - last_ns) / NS).round(3), world),
                        "in_step_active": np.tile(in_step, n),
                    }
                )
                step = pl.col("step_index")  # null before this process's first step
                frames.append(frame.with_columns(pl.when(step >= 0).then(step).alias("step_index")))
        return pl.concat(frames).sort("time") if frames else pl.DataFrame()

    def _hang_culprit(self, job: str, run: Run) -> int | None:
        """The rank a hung run waits for: the hang fault's node and GPU, if the job is there."""
        g = self.spec.gpus_per_node
        for f in self.faults:
            hit = run.hung and of(f).hangs and f.job == job and f.onset_s == run.start_s
            if hit and f.node in run.nodes:
                return run.nodes.index(f.node) * g + f.gpu
        return None

    def _empty_steps(self) -> pl.DataFrame:
        return pl.DataFrame(
            schema={
                "time": pl.Int64,
                "cluster": pl.String,
                "node": pl.String,
                "job": pl.String,
                "rank": pl.String,
                "step_index": pl.Int64,
                "step_time_s": pl.Float64,
                "tokens_count": pl.Int64,
                "samples_count": pl.Int64,
            }
        )

    def models(self, gpu_model: str) -> pl.DataFrame:
        rows = [
            {
                "time": self.spec.start_ns,
                "cluster": self.spec.cluster,
                "job": jp.spec.name,
                "dtype": jp.spec.dtype,
                "params_count": jp.spec.params_count,
                "layers_count": jp.spec.layers_count,
                "hidden_size_count": jp.spec.hidden_size_count,
                "heads_count": jp.spec.heads_count,
                "seq_len_tokens": jp.spec.seq_len_tokens,
                "world_size_count": jp.spec.nodes * self.spec.gpus_per_node,
                "tensor_parallel_count": jp.spec.tp,
                "pipeline_parallel_count": jp.spec.pp,
                "recompute_active": jp.spec.recompute_active,
                "gpu_model": gpu_model,
            }
            for jp in self.plans
        ]
        return pl.DataFrame(rows) if rows else pl.DataFrame()

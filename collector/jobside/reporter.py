"""The training-side reporter: a training loop reports each step; MFU is computed from it.

Dependency-free (the standard library and gpuwarden's own stdlib-only line-protocol encoder),
so any training script can import it::

    from gpuwarden.collector.jobside.reporter import Reporter

    rep = Reporter()                      # job, rank and node from the environment (the job
                                          # as the node agent names it: in a Kubernetes pod
                                          # <namespace>/<pod>, else Slurm's job id,
                                          # torchrun's run id or GPUWARDEN_JOB)
    rep.model(params=7_000_000_000, layers=32, hidden_size=4096, heads=32, seq_len=4096,
              world_size=64, dtype="bf16",
              vocab_size=32_000, tied_head=False,     # for MFU's FLOPs per token: the input
              embedding_params=131_072_000)           # embeddings are not matmuls, the head is
    for step in range(start, steps):
        with rep.timed_step(step, tokens=tokens_per_rank, samples=batch):
            train_step()
        if saved:                         # after each checkpoint: what the save cost
            rep.checkpoint(step, save_seconds, interval_s)
    rep.close()

The job, unless ``job=`` names it, is the one the node agent tags the job's GPUs with: inside a
Kubernetes pod ``<namespace>/<pod>`` (:func:`pod_job`; the agent names a pod's GPUs so whatever
its processes' environment says, and its relay holds the pod's reports to that name: a torchrun
run id there got 403), else the first of ``SLURM_JOB_ID``, ``TORCHELASTIC_RUN_ID`` and
``GPUWARDEN_JOB``, else ``unknown``.

It sends line protocol to ``url`` + ``/write``: the node agent's local relay by default (its
Unix socket ``unix:///run/gpuwarden/relay.sock`` where that exists: the agent then knows the
job from the caller's cgroup, which no job can forge; else ``http://127.0.0.1:9465``; the relay
spools through outages; ``GPUWARDEN_REPORTER_URL``) or
InfluxDB itself (database ``GPUWARDEN_REPORTER_DATABASE``, default ``gpuwarden``). An
``https`` URL is verified against ``ca_file`` (``GPUWARDEN_REPORTER_CA_FILE``; the system's
CAs when unset), for a relay that serves TLS (``[agent] reporter_tls_cert_file``). Sending
happens on a background thread; a training step never waits on the network: at most 5,000
lines or 512 KiB a request, half as many after a 413 (the relay's limits), and after a 429 or
503 it waits what ``Retry-After`` says. If the queue is
full (the agent is down for long) the oldest reports are dropped and counted in :attr:`dropped`.

From the first report on, the same thread also sends a ``job_heartbeat`` every ``heartbeat_s``
(30 s; 0 turns it off): the last step, the time since it, and whether the rank is inside a
:meth:`Reporter.timed_step`. The thread keeps beating while the training loop is stuck (a
collective that never returns releases the GIL while it waits), which is how analytics tells
a hung job (alive, silent) from one that ended, and a rank stuck between steps (data loading)
from ranks waiting inside one (in a collective).
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from gpuwarden.collector.attribution import job_from_environ, rank_from_environ
from gpuwarden.core.retry import Backoff, parse_retry_after
from gpuwarden.core.store.lineprotocol import Point, encode_point

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: the agent's relay socket in a deployment (``[agent] reporter_socket``)
RELAY_SOCKET = "/run/gpuwarden/relay.sock"


def default_url(socket_path: str = RELAY_SOCKET) -> str:
    """The agent's relay: its Unix socket if there is one, else its loopback port."""
    return f"unix://{socket_path}" if os.path.exists(socket_path) else "http://127.0.0.1:9465"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (``unix:///path``): the relay learns who is calling from the
    kernel (the caller's pid, hence its cgroup and its job)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


#: waits between failed posts to the relay: 0.5 s doubling to 30 s (the relay is local), or
#: what its ``Retry-After`` says (up to five minutes)
RETRY = Backoff(base_s=0.5, max_s=30.0, jitter=False)
#: the most lines one request carries
MAX_BATCH_LINES = 5000
#: the most bytes one request carries: half the relay's limit (``relay.MAX_BODY``, 1 MiB), which
#: 5,000 lines passed when a Kubernetes job's name was long, and the relay refused them whole
MAX_BATCH_BYTES = 512 * 1024


def pod_job(env: Mapping[str, str], namespace_file: str | None = None) -> str:
    """``<namespace>/<pod>`` inside a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` set), as the
    node agent names the pod holding a GPU (the kubelet's pod-resources API): the pod name
    from ``POD_NAME``, else the hostname (``HOSTNAME``: a pod's by default); the namespace
    from ``POD_NAMESPACE``, else the service-account mount (``namespace_file``, by default
    :data:`SERVICE_ACCOUNT_NAMESPACE`); ``""`` outside Kubernetes, or with no namespace known.

    The hostname is not the pod's name in a pod with a ``hostname`` of its own (an Indexed
    Job's or a JobSet's pods are ``<job>-<index>``, their names have a suffix more), with
    ``hostNetwork`` (the node's) or ``setHostnameAsFQDN``: set ``POD_NAME`` and
    ``POD_NAMESPACE`` from the downward API there (``valueFrom: {fieldRef: {fieldPath:
    metadata.name}}``, ``metadata.namespace``). A hostname that looks like one of those is
    still used, with a warning."""
    if "KUBERNETES_SERVICE_HOST" not in env:
        return ""
    namespace = env.get("POD_NAMESPACE", "")
    if not namespace:
        try:
            with open(namespace_file or SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                namespace = f.read().strip()
        except OSError:
            return ""
    pod = env.get("POD_NAME", "")
    if not pod:
        pod = env.get("HOSTNAME", "")
        if "JOB_COMPLETION_INDEX" in env or "." in pod:
            log.warning(
                "the reporter names its job %s/%s from the hostname, which in an Indexed Job "
                "or with a fully qualified hostname is not the pod's name: the agent's relay "
                "will refuse its reports; set POD_NAME from the downward API "
                "(fieldPath: metadata.name) or pass job=",
                namespace,
                pod,
            )
    return f"{namespace}/{pod}" if namespace and pod else ""


class Reporter:
    def __init__(
        self,
        job: str | None = None,
        rank: int | None = None,
        *,
        url: str | None = None,
        database: str | None = None,
        cluster: str | None = None,
        node: str | None = None,
        token: str | None = None,
        max_queue: int = 100_000,
        flush_interval_s: float = 1.0,
        heartbeat_s: float = 30.0,
        ca_file: str | None = None,
    ) -> None:
        env = os.environ
        # in a pod, the pod: the agent tags a pod's GPUs <namespace>/<pod> whatever its
        # processes' environment says (a torchrun run id), and its relay holds the pod to it
        self.job = job or pod_job(env) or job_from_environ(env) or "unknown"
        self.rank = rank if rank is not None else int(rank_from_environ(env) or 0)
        self.url = (url or env.get("GPUWARDEN_REPORTER_URL") or default_url()).rstrip("/")
        self.database = database or env.get("GPUWARDEN_REPORTER_DATABASE") or "gpuwarden"
        self.cluster = cluster or env.get("GPUWARDEN_CLUSTER", "default")
        # the node as the agent names it: GPUWARDEN_NODE if set, else Slurm's own name for it
        # (in a job, SLURMD_NODENAME: the hostname can be an FQDN the agent does not use)
        self.node = (
            node or env.get("GPUWARDEN_NODE") or env.get("SLURMD_NODENAME") or socket.gethostname()
        )
        self.token = token if token is not None else env.get("GPUWARDEN_REPORTER_TOKEN", "")
        # an https url is verified against this CA (the system's when empty)
        ca = ca_file if ca_file is not None else env.get("GPUWARDEN_REPORTER_CA_FILE", "")
        self._tls = ssl.create_default_context(cafile=ca or None) if ca else None
        self.flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self._last_step: int | None = None
        self._last_step_at = time.monotonic()
        self._in_step = False
        self._beat_at = 0.0
        self.sent = 0
        self.dropped = 0
        self.last_error = ""
        self._queue: deque[str] = deque()
        self._max_queue = max_queue
        self._batch_lines = MAX_BATCH_LINES  # halved on a 413, doubled back on success
        self._inflight = 0  # lines at the queue's head being sent now
        self._refused = 0  # lines of the last answer refused for good
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- reporting --------------------------------------------------------------------------

    def model(
        self,
        *,
        params: int,
        layers: int,
        hidden_size: int,
        heads: int,
        seq_len: int,
        world_size: int,
        dtype: str = "bf16",
        recompute: bool | str = False,
        gpu_model: str = "",
        tensor_parallel: int = 0,
        pipeline_parallel: int = 0,
        vocab_size: int = 0,
        tied_head: bool | None = None,
        embedding_params: int | None = None,
        recompute_layers: int = 0,
    ) -> None:
        """The model shape, once per job (rank 0 is enough; every rank may call it).

        ``params`` is every parameter of the model (``sum(p.numel() for p in
        model.parameters())``; a tied weight once); for a mixture of experts, the parameters
        one token passes through (the experts it is routed to, not all of them: 6 x every
        expert overstates MFU by the ratio, 3.4x for Mixtral 8x7B). MFU counts the FLOPs of
        the parameters that take part in matmuls: the input embedding tables are looked up,
        not multiplied, and the LM head is a matmul, tied to the token table or not. So say,
        when you can:

        * ``vocab_size`` and ``tied_head`` (the LM head shares the token embedding's weight);
        * ``embedding_params``: the parameters of the input embedding tables inside ``params``
          (token and learned position tables, e.g. ``sum(p.numel() for m in model.modules()
          if isinstance(m, torch.nn.Embedding) for p in m.parameters())``).

        Left out, analytics assumes, and says so beside the MFU (docs/MFU.md): with only
        ``vocab_size``, no learned position table; with neither, a standard dense decoder
        (``12·layers·hidden_size²`` parameters in its layers) whose remaining parameters are
        the token table and an untied head in equal parts; ``tied_head`` not given, untied.
        The new fields need an agent of this version or later (its relay refuses fields it
        does not know): upgrade the agents first.

        ``gpu_model`` ("" leaves it to analytics, which reads it from the agent's ``gpu_info``
        for the GPUs the job runs on). ``recompute``: ``True`` or ``"full"`` (the layers'
        forward runs again in the backward; ``recompute_layers`` of them, 0 for all) or
        ``"selective"`` (only the attention scores, Megatron's selective recomputation); for
        HFU. ``tensor_parallel`` and ``pipeline_parallel`` (Megatron order: tensor-parallel
        ranks fastest, then data-parallel, then pipeline stage) let analytics compare each rank
        with the ranks of its own pipeline stage; 0 leaves them out."""
        # (heads is not among them: analytics does not use it, and a model without attention
        # may say 0)
        sizes = {"params": params, "layers": layers, "hidden_size": hidden_size,
                 "seq_len": seq_len, "world_size": world_size}  # fmt: skip
        if low := [k for k, v in sizes.items() if not v >= 1]:
            # analytics refuses such a shape anyway (analytics.mfu.ModelShape): said here, at
            # the call that got it wrong (a WORLD_SIZE read from an unset environment, 0)
            raise ValueError(f"{', '.join(low)} must be >= 1: {sizes}")
        if recompute not in (True, False, "full", "selective", "none", ""):
            raise ValueError(f"recompute must be a bool, 'full' or 'selective', not {recompute!r}")
        selective = recompute == "selective"
        fields: dict[str, int | bool | str] = {
            "params_count": params,
            "layers_count": layers,
            "hidden_size_count": hidden_size,
            "heads_count": heads,
            "seq_len_tokens": seq_len,
            "world_size_count": world_size,
            "recompute_active": recompute not in (False, "none", ""),
        }
        if selective:
            fields["recompute_selective_active"] = True
        if recompute_layers and fields["recompute_active"] and not selective:
            fields["recompute_layers_count"] = recompute_layers
        if vocab_size:
            fields["vocab_size_count"] = vocab_size
        if tied_head is not None:
            fields["tied_head_active"] = bool(tied_head)
        if embedding_params is not None:
            fields["embedding_params_count"] = embedding_params
        if gpu_model:
            fields["gpu_model"] = gpu_model
        if tensor_parallel:
            fields["tensor_parallel_count"] = tensor_parallel
        if pipeline_parallel:
            fields["pipeline_parallel_count"] = pipeline_parallel
        tags = {"cluster": self.cluster, "job": self.job, "dtype": dtype}
        self._put(Point("job_model", tags, fields, time.time_ns()))

    def step(
        self,
        step_index: int,
        step_time_s: float,
        tokens: int,
        samples: int,
        loss: float | None = None,
        time_ns: int | None = None,
    ) -> None:
        """One training step of this rank. ``tokens`` (and ``samples``) are this rank's *share*
        of the step's global batch: analytics adds every rank's up to the step's tokens. With
        data parallelism only, the tokens this rank trained on; with tensor or pipeline
        parallelism, the ranks of one model replica share its tokens, so each says the global
        batch's tokens divided by ``world_size`` (a rank that says its replica's whole
        micro-batch counts it TP x PP times: MFU that much too high). A job where only rank 0
        reports says the step's global tokens. A misreport shows as ``mfu_mismatch`` where
        the GPU reports its tensor activity."""
        fields: dict[str, int | float] = {
            "step_index": step_index,
            "step_time_s": float(step_time_s),
            "tokens_count": tokens,
            "samples_count": samples,
        }
        if loss is not None:
            fields["loss_ratio"] = float(loss)
        self._last_step, self._last_step_at = step_index, time.monotonic()
        self._put(Point("job_step", self._rank_tags(), fields, time_ns or time.time_ns()))

    def checkpoint(
        self, step_index: int, save_s: float, interval_s: float, time_ns: int | None = None
    ) -> None:
        """A checkpoint saved: how long the save held training up (``save_s``: the blocking
        part, for an asynchronous save the copy to host memory) and the interval the job
        checkpoints at now. ``gpuwarden analyze`` advises the interval from these."""
        fields = {
            "step_index": step_index,
            "save_s": float(save_s),
            "interval_s": float(interval_s),
        }
        self._put(Point("job_checkpoint", self._rank_tags(), fields, time_ns or time.time_ns()))

    @contextmanager
    def timed_step(self, step_index: int, tokens: int, samples: int) -> Iterator[None]:
        t0 = time.perf_counter()
        self._in_step = True
        self._ensure_thread()  # beat from the first step on, even if it never ends
        try:
            yield
        finally:
            self._in_step = False
        self.step(step_index, time.perf_counter() - t0, tokens, samples)

    def _rank_tags(self) -> dict[str, str]:
        return {"cluster": self.cluster, "node": self.node, "job": self.job, "rank": str(self.rank)}

    def _heartbeat(self) -> None:
        """Queue a ``job_heartbeat`` (the sender thread calls it every ``heartbeat_s``): the
        rank is alive, whatever its training loop is doing, and says where in it it is."""
        fields: dict[str, int | float | bool] = {
            "since_step_s": round(time.monotonic() - self._last_step_at, 3),
            "in_step_active": self._in_step,
        }
        if self._last_step is not None:
            fields["step_index"] = self._last_step
        self._put(Point("job_heartbeat", self._rank_tags(), fields, time.time_ns()))

    def _put(self, point: Point) -> None:
        line = encode_point(point)
        if line is None:
            return
        self._ensure_thread()
        with self._cond:
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                if self._inflight:  # the oldest are being sent: that one leaves with them
                    self._inflight -= 1
                else:
                    self.dropped += 1
            self._queue.append(line)
            self._cond.notify()

    # -- sending ----------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is not None:  # every step passes here: no lock once it runs
            return
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, daemon=True, name="reporter")
                self._thread.start()

    def _post(self, lines: list[str]) -> tuple[bool, float | None]:
        """Send ``lines`` once: (done, seconds to wait before the next try, if the relay said).
        Done is sent, or refused for good (dropped and counted)."""
        query = urllib.parse.urlencode({"db": self.database, "precision": "ns"})
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        body = ("\n".join(lines) + "\n").encode()
        if self.url.startswith("unix://"):
            return self._post_unix(f"/write?{query}", body, headers, len(lines))
        req = urllib.request.Request(f"{self.url}/write?{query}", body, headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10, context=self._tls) as resp:
                resp.read()
            return self._answer(resp.status, b"", None, len(lines))
        except urllib.error.HTTPError as exc:
            return self._answer(exc.code, exc.read(), exc.headers.get("Retry-After"), len(lines))
        except OSError as exc:
            self.last_error = str(exc)
            return False, None

    def _post_unix(
        self, target: str, body: bytes, headers: dict[str, str], n: int
    ) -> tuple[bool, float | None]:
        conn = _UnixConnection(self.url.removeprefix("unix://"), timeout=10)
        try:
            conn.request("POST", target, body, headers)
            resp = conn.getresponse()
            text = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.last_error = str(exc)
            return False, None
        finally:
            conn.close()
        return self._answer(resp.status, text, resp.getheader("Retry-After"), n)

    def _answer(
        self, status: int, text: bytes, retry_after: str | None, n: int
    ) -> tuple[bool, float | None]:
        """What an answer means: sent; too large (413: the batch is halved and sent again at
        once; one line too large is dropped); refused for good (another 4xx: resending would be
        refused again); or try again later (429, 5xx), after ``Retry-After`` if given."""
        if status < 300:
            self._batch_lines = min(MAX_BATCH_LINES, self._batch_lines * 2)
            return True, None
        self.last_error = f"HTTP {status}: {text[:200]!r}"
        if status == 413 and n > 1:
            self._batch_lines = max(1, n // 2)
            return False, 0.0
        if 400 <= status < 500 and status != 429:
            self.dropped += n
            self._refused = n  # (not counted as sent too)
            return True, None
        return False, parse_retry_after(retry_after)

    def _beat_due(self) -> bool:
        if self.heartbeat_s <= 0 or self._closed:
            return False
        if time.monotonic() - self._beat_at < self.heartbeat_s:
            return False
        self._beat_at = time.monotonic()
        return True

    def _batch(self) -> list[str]:
        """The oldest queued lines, at most ``_batch_lines`` of them and
        :data:`MAX_BATCH_BYTES` (at least one). Called under the lock."""
        lines: list[str] = []
        size = 0
        for line in self._queue:
            size += len(line) + 1
            if lines and (len(lines) >= self._batch_lines or size > MAX_BATCH_BYTES):
                break
            lines.append(line)
        return lines

    def _run(self) -> None:
        failed = 0
        while True:
            with self._cond:  # a reentrant lock: _heartbeat queues under it
                if self._beat_due():
                    self._heartbeat()
                while not self._queue and not self._closed:
                    self._cond.wait(min(self.flush_interval_s, self.heartbeat_s or 1e9))
                    if self._beat_due():
                        self._heartbeat()
                if not self._queue and self._closed:
                    return
                lines = self._batch()
                self._inflight = len(lines)
            done, wait_s = self._post(lines)
            with self._cond:
                # a full queue pushed out some of the batch meanwhile (_put): only what is
                # left of it is taken off (before, as many newer lines went, never sent)
                left, self._inflight = self._inflight, 0
                if done:
                    for _ in range(left):
                        self._queue.popleft()
                    self.sent += len(lines) - self._refused
                    self._refused = 0
                    self._cond.notify_all()
                else:
                    self.dropped += len(lines) - left  # pushed out, and not sent after all
            if done:
                failed = 0
            elif wait_s != 0.0:  # 0: a smaller batch goes at once
                failed += 1
                # the whole wait: each step queued and each flush() wakes this thread
                # (before, they cut the backoff and Retry-After short: 17 tries in 2 s)
                until = time.monotonic() + RETRY.delay(failed, wait_s)
                with self._cond:
                    while not self._closed and (wait := until - time.monotonic()) > 0:
                        self._cond.wait(wait)
                    if self._closed:
                        return

    def flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue and time.monotonic() < deadline:
                self._cond.notify_all()
                self._cond.wait(0.05)
            return not self._queue

    def close(self, timeout_s: float = 10.0) -> bool:
        """Send what is queued (up to ``timeout_s``) and stop; False if something was left."""
        done = self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        return done

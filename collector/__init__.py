"""The node agent and the shared vocabulary (catalogue, findings, line protocol, sink).

Importing this package sets one process-wide default before polars loads: polars' allocator
(jemalloc) hands freed pages back to the OS after 0.5 s, so a writer that encodes a batch
every second or so (the agent, the relay, analytics, a replay) faults the same pages back in
on every cycle. jemalloc's own default, 10 s, keeps them for reuse: in
``benchmarks/ingest.py`` it halved the writer's page faults and cut its CPU by about 15 %.
An operator's ``_RJEM_MALLOC_CONF`` wins, and it has no effect where polars was imported first.
"""

import os

os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:10000,muzzy_decay_ms:10000")

"""The floor every gpuwarden package stands on; it imports nothing else of ours.

The shared vocabulary (:mod:`.catalogue`: every measurement, field, tag, unit and type;
:mod:`.finding`: the ``Finding`` contract; :mod:`.xidcat`: NVIDIA's XID catalogue;
:mod:`.checkpoint`: the checkpoint-request protocol between the engine and a training job),
the error tree (:mod:`.errors`), the configuration loader (:mod:`.config`), time parsing
(:mod:`.timeparse`), the retry policy (:mod:`.retry`), request signing (:mod:`.signing`), the
findings poster (:mod:`.poster`), the REAL StepFun fault trace (:mod:`.faulttrace`), and the
store path (:mod:`.store`: line protocol, transport, spool, sink, InfluxQL reader, traces).

Modules here import only the standard library unless their job needs more (the vectorised
encoder and the reader need polars, the transport urllib3), so a GPU node that installs the
``agent`` extra loads only what it uses.

Importing this package sets one process-wide default before polars loads: polars' allocator
(jemalloc) hands freed pages back to the OS after 0.5 s, so a writer that encodes a batch
every second or so (the relay, analytics, a replay) faults the same pages back in on every
cycle. jemalloc's own default, 10 s, keeps them for reuse: in ``benchmarks/ingest.py`` it
halved the writer's page faults and cut its CPU by about 15 %. An operator's
``_RJEM_MALLOC_CONF`` wins, and it has no effect where polars was imported first.
"""

import os

os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:10000,muzzy_decay_ms:10000")

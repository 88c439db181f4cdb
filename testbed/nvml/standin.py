"""Run a module with pynvml answering from a recording instead of a driver.

    python -m testbed.nvml.standin RECORDING MODULE [ARGS...]

runs ``python -m MODULE ARGS...`` with :class:`testbed.nvml.fakelib.FakeLibrary` installed
where pynvml keeps the loaded ``libnvidia-ml``, positioned on the recording's first tick. The
benchmarks that measure the real library (``benchmarks/nvml_calls.py``,
``benchmarks/nvml_real.py``) run so in CI, which has no GPU: their code paths run and cannot
rot, while the times they print are the stand-in's, not a driver's, and they say so (they
print REAL only over a real ``ctypes.CDLL``). A call the recording does not hold answers
``FUNCTION_NOT_FOUND``, as a driver without that function would.
"""

from __future__ import annotations

import runpy
import sys

from gpuwarden.collector.nvml.recorded import RecordedBackend
from testbed.nvml.fakelib import FakeLibrary, installed


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m testbed.nvml.standin RECORDING MODULE [ARGS...]", file=sys.stderr)
        return 2
    recording = RecordedBackend(argv[0])
    recording.init()
    recording.begin_cycle()  # the first tick holds the device's identity (name, UUID)
    sys.argv = [argv[1], *argv[2:]]
    with installed(FakeLibrary(recording)):
        try:
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
            return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

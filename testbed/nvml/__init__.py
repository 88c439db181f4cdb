"""NVML without a GPU: :mod:`.fakelib` stands in for ``libnvidia-ml`` under pynvml and answers
from a recording; :mod:`.construct` builds CONSTRUCTED recordings (8x H100, 8x A100);
:mod:`.record` records a real GPU's answers as a golden case (run where a GPU is)."""

"""The node agent: its loop, configuration and sources (``sources/``, NVML in ``sources/nvml/``),
the NVML backends (``nvml/``: the real library and a recorded file), the relay for training
jobs, health rules, the plausibility screen, GPU -> job attribution and pod resources.

``jobside/`` holds the libraries a *training job* imports (the step reporter and the
checkpoint hook): standard library only, so a job installs them without our dependencies.
"""

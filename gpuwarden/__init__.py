"""gpuwarden: keeps large GPU training jobs running.

The one import name of the installed product. ``gpuwarden.core``, ``gpuwarden.collector``,
``gpuwarden.analytics``, ``gpuwarden.remediation``, ``gpuwarden.dashboards`` and
``gpuwarden.simulation`` are the folders of the same names at the repository root: in a
checkout they are symbolic links here (``gpuwarden/core -> ../core``), and the wheel carries
their files under ``gpuwarden/``. The command line is :mod:`gpuwarden.cli` (``gpuwarden
<command>``). Importing this package imports nothing else, so a training job that imports
``gpuwarden.collector.jobside`` loads the standard library only.
"""

"""The twin cluster's simulated hardware: a scenario played in real time onto GPU nodes that
real agents read (:mod:`.hardware`), with each node's NVML answers (:mod:`.nvml`) and sysfs
(:mod:`.sysfs`). Only the hardware is simulated; everything that reads it is the product."""

"""Offload: where partitioned state lives when it is not on the compute device (CPU buffers, NVMe files)."""

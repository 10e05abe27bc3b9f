"""Multi-device partitioning and the Dask backend (issues 14 and 15); empty for now."""

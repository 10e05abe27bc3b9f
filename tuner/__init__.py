"""clmf autotuner: search space, measurement and the tuning database writer."""

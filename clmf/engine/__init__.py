"""The OpenCL engine: device selection (:mod:`.device`), the kernel configuration
(:mod:`.config`), kernel rendering and building (:mod:`.kernels`), the device memory plan
(:mod:`.memory`) and the buffers plus S1→S2→S3 orchestration of one fit (:mod:`.core`)."""
from .core import Engine, SideData
from .memory import choose_batch_rows, memory_estimate

__all__ = ["Engine", "SideData", "memory_estimate", "choose_batch_rows"]

"""The OpenCL engine: device selection (:mod:`.device`), the kernel configuration
(:mod:`.config`), kernel rendering and building (:mod:`.kernels`), the memory plan
(:mod:`.memory`) and the buffers plus S1→S2→S3 orchestration of one fit (:mod:`.core`)."""
from .core import Engine, SideData
from .memory import MemoryPlan, choose_batch_rows, plan_fit

__all__ = ["Engine", "SideData", "MemoryPlan", "plan_fit", "choose_batch_rows"]

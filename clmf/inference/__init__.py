"""Inference on fitted factors: ranking, similarity and fold-in (:mod:`.recommend`), ranked on
an OpenCL device by the fused top-k (:mod:`.topk`) with a host fallback."""

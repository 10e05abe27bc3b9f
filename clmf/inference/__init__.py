"""Inference on fitted factors: device top-k (:mod:`clmf.inference.topk`) with a host fallback."""

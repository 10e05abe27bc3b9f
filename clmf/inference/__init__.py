"""Inference on fitted factors: ranking, similarity and fold-in (:mod:`.recommend`)."""

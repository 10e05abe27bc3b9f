"""The benchmark (``clmf bench``): clmf against peer ALS implementations, measured device peaks
and the report.  Optional dependencies (torch, lenskit, pyspark, implicit, matplotlib) are
imported only when the peer or plot that needs them runs."""

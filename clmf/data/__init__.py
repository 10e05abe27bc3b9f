"""Rating data: the :class:`~clmf.data.ratings.Ratings` container, file loaders (one module per
format family), input validation, train/test splits, the synthetic generator and the embedded
default data set.  The public entry points are :mod:`clmf.datasets` and :mod:`clmf.splits`."""

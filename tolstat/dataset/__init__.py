"""The error dataset: one row per correct run of a kernel.

Its schema and validation (:mod:`~tolstat.dataset.schema`, including the independent
units :func:`~tolstat.dataset.schema.run_units`), run records and the dataset built from
them (:mod:`~tolstat.dataset.records`), collection from kernels or pairs
(:mod:`~tolstat.dataset.collection`) and its option objects
(:mod:`~tolstat.dataset.options`: :class:`~tolstat.dataset.options.CollectOptions`,
:class:`~tolstat.dataset.options.Store`), the resumable streaming store
(:mod:`~tolstat.dataset.stream`), file IO (:mod:`~tolstat.dataset.io`) and merging of
records (:mod:`~tolstat.dataset.merge`).
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("schema", "records", "runs", "options", "collection", "stream", "io", "merge"))

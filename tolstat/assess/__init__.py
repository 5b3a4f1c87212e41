"""Assessment: how well tolerance rules do on data with known bugs.

:func:`~tolstat.assess.comparison.compare` (cross-validated recall and false-positive
rates of tolerance rules), :func:`~tolstat.assess.hwshift.shift` (calibrate on one
hardware, check on another), :func:`~tolstat.assess.evaluation.evaluate` (the kernel
corpus) and :func:`~tolstat.assess.power.power_report` (what a table's decision catches:
standard wrong outputs and the smallest detectable errors, beside the peers' rules). Results only: printing, argument parsing and plots belong to the CLI.
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(
    __name__, ("rules", "folds", "comparison", "hwshift", "corpus_runs", "evaluation", "methods", "power",
               "gpu_transfer"))

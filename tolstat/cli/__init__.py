"""The command line (``tolstat ...``): argument parsing, printing, reports and plots.

The only layer that imports argparse or matplotlib; the entry point is
:func:`tolstat.cli.main.main`.
"""

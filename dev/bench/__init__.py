"""Overhead bench: the monitored handler against the plain one, side by side on one TorchServe.

``python -m dev bench`` (``make bench`` / ``make bench-quick``) runs it; see ``docs/bench/``.
The load generator and the statistics it uses are the package's (``hookwatch.tools.bench``),
shared with ``hookwatch bench MAR``.
"""

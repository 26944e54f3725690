"""Overhead bench: the monitored handler against the plain one, side by side on one TorchServe.

``hookwatch bench`` (``make bench`` / ``make bench-quick``) runs it; see ``docs/bench/``.
"""

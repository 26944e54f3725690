"""Soak: the native stack under steady open-loop load with bad requests and a worker killed.

``python -m dev soak`` (``make soak``, 10 minutes; ``SOAK_SECONDS``) runs it and writes
``docs/soak/``; ``tests/integration/test_soak.py`` runs the 1-minute form.
"""

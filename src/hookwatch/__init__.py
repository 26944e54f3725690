"""hookwatch: activation statistics and drift signals from forward hooks, exported to Prometheus."""

__version__ = "0.1.0"

"""``hookwatch report``: what the Grafana dashboards show, as one HTML page with PNGs, read
from Prometheus' HTTP API over a time range (``build.write_report``)."""

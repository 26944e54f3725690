"""The ``make eval-drift`` harness: scenarios from the digits data, baselines, the table."""

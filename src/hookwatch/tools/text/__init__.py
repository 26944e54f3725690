"""The text demo: all-MiniLM-L6-v2 served with hookwatch, fortunes as traffic."""

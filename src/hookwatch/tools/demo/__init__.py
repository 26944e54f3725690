"""The embedded demo: a small CNN on scikit-learn's bundled digits."""

"""The repository's own harnesses: not part of the installed package.

The overhead bench (``dev.bench``), the soak (``dev.soak``), the drift evaluation
(``dev.evaluation``) and the docs generator (``dev.catalogue_docs``) measure hookwatch and
rewrite README.md and docs/ from what they measure. They run from the repository root
(``python -m dev ...``, the ``make`` targets) and import the package; the package never imports
them. A user's own overhead measurement is ``hookwatch bench MAR`` (``hookwatch.tools.bench``).
"""

"""``hookwatch bench MAR``: a user's archive, the plain handler against hookwatch (:mod:`.ab`).

Its TorchServe (:mod:`.server`), load generator (:mod:`.loadgen`) and statistics (:mod:`.stats`)
are shared with the repository's overhead bench, which lives outside the package in ``dev/bench``
(``make bench``) and is the one that writes docs/bench/ and README.md's verdicts.
"""

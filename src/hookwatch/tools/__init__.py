"""The tools beside the runtime: the ``hookwatch`` command, the native stack, the demo, the bench
and the drift evaluation. They need ``pip install 'hookwatch[tools]'`` (``[eval]`` for the drift
evaluation); a serving process never imports them.
"""

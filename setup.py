"""Build the optional C extension of the hot path; everything else is in pyproject.toml.

``broky.protocol._forward`` (Cython) is the compiled twin of
``broky.protocol.forward.forwardable_pure``. It is optional twice over: the
build continues without it when compiling fails (``optional=True``), and
Broky runs the pure-Python version whenever it is missing.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython at build time: the pure-Python reader runs
    extensions = []
else:
    extensions = cythonize(
        [Extension("broky.protocol._forward", ["broky/protocol/_forward.pyx"], optional=True)],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=extensions)

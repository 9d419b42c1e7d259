"""Build the optional C extension of the hot path; everything else is in pyproject.toml.

``broky.protocol._forward`` and ``_vectors`` (Cython) are the compiled
twins of ``broky.protocol.forward.forwardable_pure``/``walk_pure`` and
``broky.protocol.chunks.chunk_offsets_pure``. Each is optional twice over: the
build continues without it when compiling fails (``optional=True``), and
Broky runs the pure-Python version whenever one is missing.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython at build time: the pure-Python reader runs
    extensions = []
else:
    extensions = cythonize(
        [
            Extension(f"broky.protocol.{name}", [f"broky/protocol/{name}.pyx"], optional=True)
            for name in ("_forward", "_vectors")
        ],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=extensions)

"""Build of rmq's Cython core: one extension module per ``rmq/_core/*.pyx``."""
import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("RMQ_DEBUG") == "1"

CFLAGS = ["-O3", "-Wall", "-Wno-unused-function", "-Wno-unreachable-code"]
if DEBUG:
    CFLAGS += ["-O0", "-g", "-DRMQ_DEBUG=1"]

DIRECTIVES = {
    "language_level": 3,
    "embedsignature": True,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
}


def extensions():
    exts = []
    for pyx in sorted(glob.glob(os.path.join("rmq", "_core", "*.pyx"))):
        name = pyx[:-4].replace(os.sep, ".")
        exts.append(Extension(name, [pyx], include_dirs=["rmq/_core"], extra_compile_args=CFLAGS))
    return exts


setup(ext_modules=cythonize(extensions(), compiler_directives=DIRECTIVES, annotate=DEBUG))

"""Build of rmq's Cython core (one extension module per ``rmq/_core/*.pyx``) and of the proxy's
gRPC messages (``rmq/proxy/grpc_v2/messaging_pb2.py`` from ``messaging.proto``, by grpcio-tools'
protoc): both are build outputs, never committed."""
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


PROTOS = [os.path.join("rmq", "proxy", "grpc_v2", "messaging.proto")]


def generate_protos():
    """``protoc --python_out --pyi_out`` for PROTOS, into the source tree (paths relative to the
    repository root: the generated module imports as ``rmq.proxy.grpc_v2.messaging_pb2``)."""
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for proto in PROTOS:
        out = proto[:-len(".proto")] + "_pb2.py"
        if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(proto):
            continue
        rc = protoc.main(["protoc", "-I.", f"-I{include}", "--python_out=.", "--pyi_out=.", proto])
        if rc != 0:
            raise SystemExit(f"protoc failed on {proto} (exit {rc})")


def extensions():
    exts = []
    for pyx in sorted(glob.glob(os.path.join("rmq", "_core", "*.pyx"))):
        name = pyx[:-4].replace(os.sep, ".")
        exts.append(Extension(name, [pyx], include_dirs=["rmq/_core"], extra_compile_args=CFLAGS))
    return exts


generate_protos()
setup(ext_modules=cythonize(extensions(), compiler_directives=DIRECTIVES, annotate=DEBUG))

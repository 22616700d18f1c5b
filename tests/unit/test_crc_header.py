"""crc32.h compiled on its own with gcc against zlib, under each compile-time engine switch."""
import os
import pathlib
import shutil
import subprocess

import pytest

from rmq._core.crc import _ENGINES, _engine

_BEST = _engine()

_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "crc32.h"

static uint64_t s = 88172645463325252ull;
static uint64_t xr(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }

int main(void)
{
    size_t big = (4u << 20) + 7, bigs[] = {1u << 20, (4u << 20) + 7, 65536 + 17, 4096};
    unsigned char *src = malloc(big + 64), *dst = malloc(big + 256);
    long fails = 0;
    int e, emax = rmq_crc32_set_engine(99);
    for (size_t i = 0; i < big + 64; i++) src[i] = (unsigned char)xr();
    for (e = emax; e >= 0; e--) {
        rmq_crc32_set_engine(e);
        for (size_t n = 0; n <= 1100; n++)
            for (int so = 0; so < 64; so++) {
                int dof = (so * 37 + (int)n * 11) & 63;
                uint32_t init = (uint32_t)xr(), z = (uint32_t)crc32(init, src + so, (uInt)n);
                fails += rmq_crc32(init, src + so, n) != z;
                memset(dst, 0xA5, n + 128);
                fails += rmq_crc32_copy(init, dst + dof, src + so, n) != z;
                fails += memcmp(dst + dof, src + so, n) != 0;
                for (int j = 0; j < 64; j++)
                    fails += (j < dof && dst[j] != 0xA5) + (dst[dof + n + j] != 0xA5);
            }
        for (int b = 0; b < 4; b++) {
            uint32_t z = (uint32_t)crc32(7, src + 3, (uInt)bigs[b]);
            fails += rmq_crc32(7, src + 3, bigs[b]) != z;
            fails += rmq_crc32_copy(7, dst + 5, src + 3, bigs[b]) != z || memcmp(dst + 5, src + 3, bigs[b]);
        }
        for (int t = 0; t < 20000; t++) {
            uint32_t a = (uint32_t)xr(), b = (uint32_t)xr();
            int64_t n = (int64_t)((xr() >> 1) >> (xr() % 64));
            fails += rmq_crc32_combine(a, b, n) != (uint32_t)crc32_combine(a, b, (z_off_t)n);
        }
    }
    printf("engine %d %ld\n", emax, fails);
    return fails != 0;
}
"""


@pytest.mark.parametrize("define,engine_max", [
    ("", None), ("-DRMQ_CRC32_NO_VPCLMUL", 1), ("-DRMQ_CRC32_NO_CLMUL", 0),
])
def test_c_header_compile_switches(define, engine_max, tmp_path):
    """crc32.h vs zlib for every engine, under each compile-time switch."""
    gcc = shutil.which("gcc")
    if gcc is None or not os.path.exists("/usr/include/zlib.h"):
        pytest.skip("needs gcc and zlib.h")
    core = pathlib.Path(__file__).resolve().parents[2] / "rmq" / "_core"
    (tmp_path / "h.c").write_text(_HARNESS)
    exe = tmp_path / "h"
    cmd = [gcc, "-O2", "-Wall", "-Werror", "-Wno-unused-function", *([define] if define else []),
           f"-I{core}", str(tmp_path / "h.c"), "-o", str(exe), "-lz"]
    subprocess.run(cmd, check=True, capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    emax, fails = map(int, out.stdout.split()[1:])
    assert fails == 0
    if engine_max is not None:
        assert emax == engine_max
    else:
        assert _ENGINES[emax] == _BEST


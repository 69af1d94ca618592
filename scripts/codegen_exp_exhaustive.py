"""Every float32 input (all 2^32 bit patterns) through the C dialect's
generated exps (devkit.codegen.printers._C_MATH: dk_expf over every input,
dk_expf_checked where it does not flag its argument) against libm's exp in
float64 rounded to float32, compiled with the fusion pass's flags
(devkit.engine.fusion.OPTIONS["c"], -O3 -march=native as the cpu plugin
compiles): prints the largest ulp error of each and any NaN mismatch.

    python scripts/codegen_exp_exhaustive.py [STRIDE]

STRIDE (default 1: every input) tests every STRIDE-th bit pattern only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from devkit.codegen.printers import _C_MATH
from devkit.engine.fusion import OPTIONS

HARNESS = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
%(math)s
static int64_t ordered(float f) {
  int32_t b;
  memcpy(&b, &f, sizeof b);
  return b < 0 ? (int64_t)INT32_MIN - b : b;
}
int main(int argc, char **argv) {
  uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  enum { BLOCK = 4096 };
  static float x[BLOCK], full[BLOCK], checked[BLOCK];
  int64_t worst_full = 0, worst_checked = 0;
  float at_full = 0, at_checked = 0;
  long nan_mismatches = 0;
  for (uint64_t u = 0; u < (1ull << 32);) {
    int n = 0;
    for (; n < BLOCK && u < (1ull << 32); n++, u += stride) {
      uint32_t bits = (uint32_t)u;
      memcpy(&x[n], &bits, sizeof bits);
    }
    int slow = 0;
    for (int i = 0; i < n; i++) checked[i] = dk_expf_checked(x[i], &slow);
    for (int i = 0; i < n; i++) full[i] = dk_expf(x[i]);
    for (int i = 0; i < n; i++) {
      float want = (float)exp((double)x[i]);
      if (want != want) {
        nan_mismatches += full[i] == full[i];
        continue;
      }
      int64_t e = llabs(ordered(full[i]) - ordered(want));
      if (e > worst_full) worst_full = e, at_full = x[i];
      if (fabsf(x[i]) <= 86.0f && (e = llabs(ordered(checked[i]) - ordered(want))) > worst_checked)
        worst_checked = e, at_checked = x[i];
    }
  }
  printf("dk_expf: at most %%lld ulp (at %%a); dk_expf_checked, unflagged: at most %%lld ulp (at %%a); "
         "NaN mismatches: %%ld\n", (long long)worst_full, at_full, (long long)worst_checked, at_checked,
         nan_mismatches);
  return worst_full > 1 || worst_checked > 1 || nan_mismatches;
}
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = os.path.join(tmp, "exp.c"), os.path.join(tmp, "exp")
        with open(source, "w") as f:
            f.write(HARNESS % {"math": _C_MATH})
        subprocess.run([os.environ.get("CC", "cc"), "-O3", "-march=native", *OPTIONS["c"].split(), source, "-lm",
                        "-o", binary], check=True)
        return subprocess.run([binary, *sys.argv[1:2]]).returncode


if __name__ == "__main__":
    sys.exit(main())

"""dk_tan(double): tan within 1 ulp for the float64 Tan kernel.

OpenCL allows its double tan 5 ulp, and PoCL's is up to 3 ulp from the
correctly rounded result, outside the spec's 1 ulp. This one reduces the
argument exactly enough for every double (Payne-Hanek: x 2/pi from the bits
of 2/pi, in integer arithmetic) and evaluates fdlibm's __kernel_tan (error
below 1 ulp) on the double-double remainder.

Error budget of the reduction: the 192 bits of 2/pi taken past the ones that
only add multiples of 4 to x 2/pi leave an absolute error below 2^-137 in
x 2/pi, and no double lies closer to a multiple of pi/2 than about 2^-61
(Muller, Elementary Functions, 11.3), so the remainder is accurate to ~2^-75
relative; its double-double form keeps 117 bits.
"""

TAN_F64 = """
/* The first 1280 bits of 2/pi after the binary point, most significant first. */
constant ulong dk_two_over_pi[20] = {
  0xa2f9836e4e441529ul, 0xfc2757d1f534ddc0ul, 0xdb6295993c439041ul, 0xfe5163abdebbc561ul,
  0xb7246e3a424dd2e0ul, 0x06492eea09d1921cul, 0xfe1deb1cb129a73eul, 0xe88235f52ebb4484ul,
  0xe99c7026b45f7e41ul, 0x3991d639835339f4ul, 0x9c845f8bbdf9283bul, 0x1ff897ffde05980ful,
  0xef2f118b5a0a6d1ful, 0x6d367ecf27cb09b7ul, 0x4f463f669e5fea2dul, 0x7527bac7ebe5f17bul,
  0x3d0739f78a5292eaul, 0x6bfb5fb11f8d5d08ul, 0x56033046fc7b6babul, 0xf0cfbc209af4361dul,
};

/* 64 bits of 2/pi from bit a on (bit 0 is the first after the point). */
inline ulong dk_two_over_pi_bits(int a) {
  int w = a >> 6, s = a & 63;
  return s ? (dk_two_over_pi[w] << s) | (dk_two_over_pi[w + 1] >> (64 - s)) : dk_two_over_pi[w];
}

/* Bits [pos, pos + 64) of the 256-bit p (p[0] least significant), 0 outside it. */
inline ulong dk_bits256(const ulong *p, int pos) {
  ulong r = 0;
  for (int k = 0; k < 4; ++k) {
    int shift = 64 * k - pos;
    if (shift >= 0 && shift < 64) r |= p[k] << shift;
    else if (shift < 0 && shift > -64) r |= p[k] >> -shift;
  }
  return r;
}

/* x = (*hi + *lo) + n pi/2 with |*hi| <= pi/4, for finite x >= pi/4; returns n mod 4. */
inline int dk_reduce_pio2(double x, double *hi, double *lo) {
#pragma OPENCL FP_CONTRACT OFF
  ulong bits = as_ulong(x);
  int e = (int)(bits >> 52) - 1075;                      /* x = m 2^e */
  ulong m = (bits & 0xfffffffffffffUL) | 0x10000000000000UL;
  /* The bits of 2/pi before j0 only add multiples of 4 to x 2/pi. */
  int j0 = max(1, e - 1);
  ulong w2 = dk_two_over_pi_bits(j0 - 1), w1 = dk_two_over_pi_bits(j0 + 63),
        w0 = dk_two_over_pi_bits(j0 + 127);
  /* p = m W, W = w2 w1 w0; x 2/pi = p 2^-b (mod 4). */
  ulong p[4];
  p[0] = m * w0;
  ulong h0 = mul_hi(m, w0), l1 = m * w1, h1 = mul_hi(m, w1), l2 = m * w2, h2 = mul_hi(m, w2);
  p[1] = h0 + l1;
  ulong carry = p[1] < h0;
  p[2] = h1 + l2;
  ulong carry2 = p[2] < h1;
  p[2] += carry;
  carry2 += p[2] < carry;
  p[3] = h2 + carry2;
  int b = j0 + 191 - e;
  int n = (int)(dk_bits256(p, b) & 3);
  ulong f2 = dk_bits256(p, b - 64), f1 = dk_bits256(p, b - 128), f0 = dk_bits256(p, b - 192);
  double sign = 1;
  if (f2 >> 63) {  /* a fraction of 1/2 or more: the remainder from the next multiple */
    n = (n + 1) & 3;
    sign = -1;
    f0 = ~f0 + 1;
    f1 = ~f1 + (f0 == 0);
    f2 = ~f2 + (f0 == 0 && f1 == 0);
  }
  /* f2 is nonzero: the fraction is at least ~2^-62 (see elementwise_tan.py). */
  int s = clz(f2);
  ulong h = s ? (f2 << s) | (f1 >> (64 - s)) : f2;
  ulong l = s ? (f1 << s) | (f0 >> (64 - s)) : f1;
  /* fraction = (h + l 2^-64) 2^(-64-s): a double-double f + g, then times pi/2. */
  double top = (double)(h & ~0x7ffUL);
  double rest = (double)(h & 0x7ffUL) + (double)l * 0x1p-64;
  double f = top + rest, g = rest - (f - top);
  const double pio2_hi = 0x1.921fb54442d18p+0, pio2_lo = 0x1.1a62633145c07p-54;
  double r = f * pio2_hi;
  double r_err = fma(f, pio2_hi, -r) + (f * pio2_lo + g * pio2_hi);
  double r_hi = r + r_err;
  *hi = sign * ldexp(r_hi, -64 - s);
  *lo = sign * ldexp(r_err - (r_hi - r), -64 - s);
  return n;
}

/* fdlibm's __kernel_tan: tan(x + y) for |x| <= ~pi/4 (y the tail of x) if
 * iy = 1, -1 / tan(x + y) if iy = -1. */
constant double dk_tan_T[13] = {
  0x1.5555555555563p-2, 0x1.111111110fe7ap-3, 0x1.ba1ba1bb341fep-5, 0x1.664f48406d637p-6,
  0x1.226e3e96e8493p-7, 0x1.d6d22c9560328p-9, 0x1.7dbc8fee08315p-10, 0x1.344d8f2f26501p-11,
  0x1.026f71a8d1068p-12, 0x1.47e88a03792a6p-14, 0x1.2b80f32f0a7e9p-14, -0x1.375cbdb605373p-16,
  0x1.b2a7074bf7ad4p-16,
};

inline double dk_kernel_tan(double x, double y, int iy) {
#pragma OPENCL FP_CONTRACT OFF
  const double pio4 = 0x1.921fb54442d18p-1, pio4lo = 0x1.1a62633145c07p-55;
  constant double *T = dk_tan_T;
  int hx = (int)(as_ulong(x) >> 32);
  int big = (hx & 0x7fffffff) >= 0x3fe59428;  /* |x| >= 0.6744: tan(pi/4 - x) is better */
  if (big) {
    if (hx < 0) {
      x = -x;
      y = -y;
    }
    x = (pio4 - x) + (pio4lo - y);
    y = 0;
  }
  double z = x * x, w = z * z;
  /* x^5 (T1 + x^4 T3 + ... + x^20 T11) + x^5 (x^2 (T2 + x^4 T4 + ... + x^20 T12)) */
  double r = T[1] + w * (T[3] + w * (T[5] + w * (T[7] + w * (T[9] + w * T[11]))));
  double v = z * (T[2] + w * (T[4] + w * (T[6] + w * (T[8] + w * (T[10] + w * T[12])))));
  double s = z * x;
  r = y + z * (s * (r + v) + y);
  r += T[0] * s;
  w = x + r;
  if (big) {
    v = (double)iy;
    return (double)(1 - ((hx >> 30) & 2)) * (v - 2 * (x - (w * w / (w + v) - r)));
  }
  if (iy == 1) return w;
  /* -1 / (x + r), accurately: z + v = x + r with z's low word cleared. */
  z = as_double(as_ulong(w) & 0xffffffff00000000UL);
  v = r - (z - x);
  double a = -1 / w;
  double t = as_double(as_ulong(a) & 0xffffffff00000000UL);
  s = 1 + t * z;
  return t + a * (s + t * v);
}

inline double dk_tan(double x) {
  double ax = fabs(x);
  if (!isfinite(x)) return x - x;
  if (ax < 0x1p-27) return x;  /* tan x = x within half an ulp, signed zeros included */
  if (ax <= 0x1.921fb54442d18p-1) return dk_kernel_tan(x, 0, 1);
  double hi, lo;
  int n = dk_reduce_pio2(ax, &hi, &lo);
  double t = dk_kernel_tan(hi, lo, 1 - ((n & 1) << 1));
  return x < 0 ? -t : t;
}
"""

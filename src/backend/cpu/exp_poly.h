// The constants of the vector exp(x) for x <= 0 that each register width implements (simd.h: 256-bit;
// attention_avx512.cc: 512-bit): Cody-Waite range reduction by ln 2 in two parts and a degree-6
// polynomial on [-ln2/2, ln2/2], ~1 ulp; below kFloor the result is exactly 0.
#pragma once

namespace squeezekv::cpu::exp_poly {
constexpr float kFloor = -87.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
// y = ((((p0 r + p1) r + p2) r + p3) r + p4) r + p5, then exp(r) = y r^2 + r + 1
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                         5.0000001201e-1f};
}  // namespace squeezekv::cpu::exp_poly

// Test vectors for `moecheck probe`: families of 64 x 8 tiles of e4m3 dot products
// (kernels/mma_probe.hpp), each built to expose one property of a tensor core's accumulation, in
// the manner of Fasi, Higham, Mikaitis and Pranesh (PeerJ CS 2021): a term far below the largest
// shows how many bits survive the alignment and in which direction they are cut; a cancelling
// pair shows whether the alignment precedes the sum; a large accumulator shows whether it takes
// part in the alignment; full-significand products show whether the exponent used is the sum of
// the exponent fields or the product's own. Every tile is a pure function of (family, seed, tile).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mma_probe.hpp"

namespace moecheck::probe {

struct ProbeFamily {
  std::string name;  // one of probe_family_names()
  int nk = 1;        // chained instructions (K = 32 nk)
  int64_t tiles = 0;
};

// "gaussian": N(0,1) activations and weights quantized to e4m3 with per-row and per-column
//   exponent offsets, c = 0 or of the size of a partial sum (the common case).
// "codes": every finite e4m3 code equally likely (products over 36 binades).
// "two-scale": each operand either "big" or "small" by a random exponent gap of 0-24 binades, so
//   products sit at a few exponents far apart: which bits of the small ones survive.
// "cancel": pairs of big products that cancel exactly, plus small terms.
// "carry": products with full significands (1.75-1.875 squared) at one exponent: carries and the
//   alignment exponent.
// "accumulator": tiny or no products and a float32 c with a random 24-bit significand over a wide
//   exponent range: whether and how c itself is cut.
std::vector<std::string> probe_family_names();

// The families and sizes `moecheck probe` runs by default: at least `dot_products` dot products
// over all families (each tile holds 512).
std::vector<ProbeFamily> default_probe_families(int64_t dot_products);

// The tiles of one family. Throws std::invalid_argument for an unknown name.
kernels::ProbeTiles make_probe_tiles(const ProbeFamily& f, uint64_t seed);

}  // namespace moecheck::probe

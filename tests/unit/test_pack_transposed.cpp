// The tiled kernels' K/V tile packing (backends/cpu/tiled.hpp pack_transposed:
// W × W blocks transposed in registers, scalar edges, zero padding) against the
// definition dst[d·ldd + c] = src[c·lds + d] (c < n), 0 (n ≤ c < ldd), for
// sizes on both sides of the vector width.
#include <catch2/catch.hpp>

#include <continuum/backends/cpu/tiled.hpp>

#include <vector>

TEMPLATE_TEST_CASE("pack_transposed is the transpose, zero-padded", "[unit][tiled]", float, double) {
  using continuum::index_t;
  const index_t n = GENERATE(0, 1, 7, 8, 16, 17, 100, 128);
  const index_t cols = GENERATE(1, 5, 8, 16, 17, 64);
  const index_t lds = cols + 3, ldd = (n + 15) / 16 * 16 + 16;
  std::vector<TestType> src(static_cast<std::size_t>(std::max<index_t>(1, n * lds)));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = TestType(i + 1);
  std::vector<TestType> dst(static_cast<std::size_t>(cols * ldd), TestType(-7));
  continuum::cpu_detail::tiled::pack_transposed<TestType>(src.data(), lds, n, cols, dst.data(), ldd);
  index_t wrong = 0;
  for (index_t d = 0; d < cols; ++d)
    for (index_t c = 0; c < ldd; ++c)
      wrong += dst[static_cast<std::size_t>(d * ldd + c)] != (c < n ? src[static_cast<std::size_t>(c * lds + d)] : TestType(0));
  INFO("n " << n << " cols " << cols);
  CHECK(wrong == 0);
}

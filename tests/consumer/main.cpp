#include <continuum/continuum.hpp>
#include <cstdio>
#include <vector>

int main() {  // causal continuum attention, batch 1, 2 heads, 6 tokens, head_dim 4
  const continuum::index_t B = 1, H = 2, L = 6, D = 4;
  std::vector<double> q(B * H * L * D), k(q.size()), v(q.size()), o(q.size()), lse(B * H * L);
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = 0.1 * double(i % 3), k[i] = 0.2 * double(i % 7), v[i] = double(i % 5);
  using View = continuum::TensorView<const double>;
  continuum::ForwardArgs<double> args;
  args.query = View::bhsd(q.data(), B, H, L, D);   // [batch, heads, seq, dim], contiguous
  args.key = View::bhsd(k.data(), B, H, L, D);
  args.value = View::bhsd(v.data(), B, H, L, D);
  args.out = continuum::TensorView<double>::bhsd(o.data(), B, H, L, D);
  args.lse = lse.data();                           // log Z per query (natural log); optional
  args.temperature.value = 0.3;                    // tau > 0 (MATH.md §1)
  args.visibility.causal = true;                   // bottom-right aligned (MATH.md §3)
  continuum::attention_forward(continuum::cpu, args);
  std::printf("o[0,0,5,:] = %.6f %.6f %.6f %.6f  lse = %.6f\n", o[20], o[21], o[22], o[23], lse[5]);
  return o[0] == v[0] && o[3] == v[3] ? 0 : 1;     // row 0 sees one key: o = v (MATH.md §7.1)
}

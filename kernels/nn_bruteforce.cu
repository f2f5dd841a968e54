// Brute-force nearest neighbour in 3-D, fp32, batched over samples of ragged length.
//
// grid  = (ceil(n_max / blockDim.x), batch)   block = (threads, 1, 1)
// dynamic shared memory = 3 * blockDim.x * sizeof(float)
//
// Each thread owns one query point a[batch, i]; the block walks the reference cloud
// b[batch, 0:len_b[batch]] in tiles of blockDim.x points staged in shared memory and keeps the
// smallest squared distance (difference form, not the |a|^2 + |b|^2 - 2ab expansion) and its index.
// Strict '<' keeps the lowest index among exact ties, like argmin. Query slots at or past
// len_a[batch] (padding) get distance 0 and index -1.
//
// a: (batch, n_max, 3) float32, b: (batch, m_max, 3) float32, both C-contiguous.
// len_a, len_b: (batch,) int64 with 1 <= len_a <= n_max and 1 <= len_b <= m_max.
// out_dist: (batch, n_max) float32; out_index: (batch, n_max) int32.
#include "kernel_select.cuh"

XM_KERNEL(nn_bruteforce) void nn_bruteforce(const float* __restrict__ a,
                                         const float* __restrict__ b,
                                         const long long* __restrict__ len_a,
                                         const long long* __restrict__ len_b,
                                         const int n_max,
                                         const int m_max,
                                         float* __restrict__ out_dist,
                                         int* __restrict__ out_index)
{
    extern __shared__ float tile[];  // 3 * blockDim.x floats: x0 y0 z0 x1 y1 z1 ...

    const int sample = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int na = (int)len_a[sample];
    const int nb = (int)len_b[sample];
    const float* b_sample = b + (size_t)sample * m_max * 3;
    const bool active = i < na;

    float qx = 0.0f, qy = 0.0f, qz = 0.0f;
    if (active) {
        const float* q = a + ((size_t)sample * n_max + i) * 3;
        qx = q[0];
        qy = q[1];
        qz = q[2];
    }
    float best = __int_as_float(0x7f800000);  // +inf
    int best_index = -1;

    // Every thread of the block runs every iteration (nb is uniform over the block), so the
    // barriers are reached by all of them; inactive threads only help to load tiles.
    for (int start = 0; start < nb; start += blockDim.x) {
        const int count = min((int)blockDim.x, nb - start);
        for (int t = threadIdx.x; t < 3 * count; t += blockDim.x) {
            tile[t] = b_sample[(size_t)start * 3 + t];
        }
        __syncthreads();
        if (active) {
            for (int t = 0; t < count; ++t) {
                const float dx = qx - tile[3 * t];
                const float dy = qy - tile[3 * t + 1];
                const float dz = qz - tile[3 * t + 2];
                const float d = dx * dx + dy * dy + dz * dz;
                if (d < best) {
                    best = d;
                    best_index = start + t;
                }
            }
        }
        __syncthreads();
    }

    if (i < n_max) {
        const size_t out = (size_t)sample * n_max + i;
        out_dist[out] = active ? best : 0.0f;
        out_index[out] = active ? best_index : -1;
    }
}

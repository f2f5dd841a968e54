// Brute-force nearest neighbour in 3-D, fp32, batched over samples of ragged length, in two launches.
//
// nn_bruteforce: grid = (ceil(n_max / blockDim.x), batch, splits)   block = (threads, 1, 1)
// dynamic shared memory = 3 * blockDim.x * sizeof(float)
//
// Each thread owns one query point a[batch, i]; block z walks its part [z chunk, (z + 1) chunk) of
// the reference cloud b[batch, 0:len_b[batch]] in tiles of blockDim.x points staged in shared memory
// and keeps the smallest squared distance (difference form, not the |a|^2 + |b|^2 - 2ab expansion)
// and its index. Strict '<' keeps the lowest index among exact ties, like argmin. The parts let a
// few queries (a training step's 3000 ground-truth points) fill the GPU.
// nn_bruteforce_merge: a thread per (sample, query) takes the parts' minimum in their order, strict
// '<' again, so the lowest index among exact ties wins as in one walk over the whole cloud. Query
// slots at or past len_a[batch] (padding) get distance 0 and index -1.
//
// a: (batch, n_max, 3) float32, b: (batch, m_max, 3) float32, both C-contiguous.
// len_a, len_b: (batch,) int64 with 1 <= len_a <= n_max and 1 <= len_b <= m_max.
// part_dist, part_index: (splits, batch, n_max) float32 and int32;
// out_dist: (batch, n_max) float32; out_index: (batch, n_max) int64.
#include "kernel_select.cuh"

XM_KERNEL(nn_bruteforce) void nn_bruteforce(const float* __restrict__ a,
                                         const float* __restrict__ b,
                                         const long long* __restrict__ len_a,
                                         const long long* __restrict__ len_b,
                                         const int n_max,
                                         const int m_max,
                                         const int chunk,
                                         float* __restrict__ part_dist,
                                         int* __restrict__ part_index)
{
    extern __shared__ float tile[];  // 3 * blockDim.x floats: x0 y0 z0 x1 y1 z1 ...

    const int sample = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int na = (int)len_a[sample];
    const int first = blockIdx.z * chunk;
    const int nb = min((int)len_b[sample], first + chunk);   // this part ends here
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
    for (int start = first; start < nb; start += blockDim.x) {
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
        const size_t out = ((size_t)blockIdx.z * gridDim.y + sample) * n_max + i;
        part_dist[out] = best;
        part_index[out] = best_index;
    }
}

XM_KERNEL(nn_bruteforce_merge) void nn_bruteforce_merge(const float* __restrict__ part_dist,
                                                     const int* __restrict__ part_index,
                                                     const long long* __restrict__ len_a,
                                                     const int batch,
                                                     const int n_max,
                                                     const int splits,
                                                     float* __restrict__ out_dist,
                                                     long long* __restrict__ out_index)
{
    const long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= (long long)batch * n_max) return;
    const int sample = (int)(q / n_max), i = (int)(q - (long long)sample * n_max);
    float best = part_dist[q];
    int best_index = part_index[q];
    for (int z = 1; z < splits; ++z) {
        const float d = part_dist[(long long)z * batch * n_max + q];
        if (d < best) {
            best = d;
            best_index = part_index[(long long)z * batch * n_max + q];
        }
    }
    const bool active = i < (int)len_a[sample];
    out_dist[q] = active ? best : 0.0f;
    out_index[q] = active ? best_index : -1;
}

// The 16-bit activation types of the "fp16" and "bf16" modes, shared by projection.cu, deformation.cu and the wgmma
// kernels (xmesh/backends/cuda_kernels.py expands the include): bfloat16 travels as the upper 16 bits
// of a float32, held in an unsigned short (CuPy has no bfloat16 type).

// A float16 (bf16 = false) or bfloat16 (bf16 = true) value as float32 (exact).
__device__ __forceinline__ float xm_widen16(unsigned short h, bool bf16) {
    if (bf16) return __uint_as_float((unsigned)h << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}

// x rounded to nearest even float16 (bf16 = false) or bfloat16 (bf16 = true), as its 16 bits (finite x;
// bfloat16 by integer rounding, which every GPU runs, the same bits as cvt.rn.bf16.f32 gives).
__device__ __forceinline__ unsigned short xm_round16(float x, bool bf16) {
    if (bf16) {
        const unsigned u = __float_as_uint(x);
        return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    return h;
}

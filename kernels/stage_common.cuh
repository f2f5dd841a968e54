// What every stage file (convolution.cu, projection.cu, graph_conv.cu, deformation.cu) starts with:
// the per-kernel build's selection and the check that the backend passed its launch constants.
#include "kernel_select.cuh"

// Launch constants and row formats: one Python definition each (xmesh/backends/kernel_constants.py,
// STAGE_DEFINES), passed with -D by the backend.
#if !defined(XM_HYP) \
    || !defined(XM_MAX_VIEWS) \
    || !defined(XM_ROWS_F32) \
    || !defined(XM_ROWS_F16) \
    || !defined(XM_ROWS_BF16) \
    || !defined(XM_GP_POINTS) \
    || !defined(XM_GP_THREADS) \
    || !defined(XM_LP_POINTS) \
    || !defined(XM_LP_THREADS) \
    || !defined(XM_SU_VERTS) \
    || !defined(XM_SU_THREADS) \
    || !defined(XM_SF_VERTS) \
    || !defined(XM_SF_THREADS) \
    || !defined(XM_SKINNY_K) \
    || !defined(XM_SKINNY_COLS)
#error "the stage kernels are built with the backend's -D constants (xmesh/backends/kernel_constants.py)"
#endif

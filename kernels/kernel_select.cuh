// Which kernels a build makes (xmesh/backends/cuda_kernels.py). Each kernel is defined as
//     XM_KERNEL(name) void [__launch_bounds__(...)] name(...) { ... }
// A build of the whole file makes every kernel. A build for some kernels defines XM_SELECT and, for
// each kernel it wants, XM_WANT_<name> as `~, 1`: the wanted ones are then `extern "C" __global__`,
// the others function templates that are never instantiated, so NVRTC parses them but generates no
// code for them (the cost of a build is in code generation, kernel by kernel).
#define XM_CAT_(a, b) a##b
#define XM_CAT(a, b) XM_CAT_(a, b)
#define XM_SECOND_(a, b, ...) b
#define XM_SECOND(...) XM_SECOND_(__VA_ARGS__)
#define XM_BUILD_1 extern "C" __global__
#define XM_BUILD_0 template <int XmNotBuilt> __global__
#ifdef XM_SELECT
#define XM_KERNEL(NAME) XM_CAT(XM_BUILD_, XM_SECOND(XM_CAT(XM_WANT_, NAME), 0, ~))
#else
#define XM_KERNEL(NAME) extern "C" __global__
#endif

"""The 16-bit modes' activations: float16, or bfloat16 bits held in uint16 arrays (CuPy has no bfloat16 type)."""

from __future__ import annotations


def activation_dtype(cupy, operands: str):
    """The array type of a 16-bit mode's activations: float16 for "fp16", uint16 (bfloat16 bits) for "bf16"."""
    if operands == "fp16":
        return cupy.dtype(cupy.float16)
    if operands == "bf16":
        return cupy.dtype(cupy.uint16)
    raise ValueError(f"operands={operands!r} has no 16-bit activations (only fp16 and bf16)")


def narrow16(cupy, x, operands: str):
    """float32 ``x`` rounded to nearest even in a 16-bit mode's activation type (finite values)."""
    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    if operands == "bf16":
        u = x.view(cupy.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cupy.uint16)
    activation_dtype(cupy, operands)
    return x.astype(cupy.float16)


def widen16(cupy, x, operands: str):
    """float32 values of a 16-bit mode's activations ``x`` (exact: every 16-bit value is a float32)."""
    if x.dtype != activation_dtype(cupy, operands):
        raise ValueError(f"expected {operands} activations ({activation_dtype(cupy, operands)}), got {x.dtype}")
    if operands == "bf16":
        return (x.astype(cupy.uint32) << 16).view(cupy.float32)
    return x.astype(cupy.float32)

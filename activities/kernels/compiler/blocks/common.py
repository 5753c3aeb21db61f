"""Index arithmetic the kernel generators share: names keyed by source, flat index decomposition, strided offsets."""

from __future__ import annotations

import hashlib


def kernel_name(prefix: str, source: str) -> str:
    """A kernel name unique to its source (two graphs' kernels never collide, equal ones are written once)."""
    return f"{prefix}_{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def jit(name: str, source: str) -> tuple[str, str]:
    """(name, source) of a generated `def KERNEL(...)` with its name filled in, decorated @triton.jit."""
    return name, "@triton.jit\n" + source.replace("KERNEL", name, 1)


def decompose(var: str, sizes: list[str], names: list[str], indent: str) -> list[str]:
    """Lines splitting flat index `var` into `names` over `sizes` (last fastest)."""
    if not names:
        return []
    rem = f"rem_{var}"  # one name per index: the compiler refuses a variable whose type changes in a loop
    lines = [f"{indent}{rem} = {var}"]
    for k in range(len(names) - 1, 0, -1):
        lines += [f"{indent}{names[k]} = {rem} % {sizes[k]}", f"{indent}{rem} = {rem} // {sizes[k]}"]
    lines.append(f"{indent}{names[0]} = {rem}")
    return lines


def offset(idx: list[str], strides: list[str], zero: str) -> str:
    """sum(idx[k] * strides[k]) (or `zero * 0` for rank 0, keeping the index's shape)."""
    return " + ".join(f"{i} * {s}" for i, s in zip(idx, strides)) or f"{zero} * 0"

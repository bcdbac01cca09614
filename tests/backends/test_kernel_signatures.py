"""Every kernel's argument types in kernel.KERNELS match its ``extern "C" __global__`` declaration in
kernels/*.cu, parameter for parameter (a pointer, an int, a long long, a float): a wrong count or
kind would pass garbage to the GPU, which no host test would otherwise notice."""

import functools
import re
from ctypes import c_float, c_int, c_longlong, c_ulonglong, c_void_p

import pytest

from cudnnnet.backends.cuda.kernel import KERNEL_DIR, KERNELS

DECLARATION = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


def parameter_kind(parameter: str):
    text = " ".join(parameter.split())
    if "*" in text:
        return c_void_p
    words = text.replace("const ", "").split()[:-1]  # the type without its name
    kinds = {("int",): c_int, ("float",): c_float, ("long", "long"): c_longlong,
             ("unsigned", "long", "long"): c_ulonglong}
    return kinds.get(tuple(words), text)


@functools.cache
def declarations() -> dict[str, list]:
    found = {}
    for path in KERNEL_DIR.glob("*.cu"):
        for name, parameters in DECLARATION.findall(path.read_text()):
            found[name] = [parameter_kind(p) for p in parameters.split(",") if p.strip()]
    return found


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_kernel_s_argument_types_are_its_declaration_s(name):
    filename, types = KERNELS[name]
    declared = declarations()
    assert name in declared, f"{name} is not declared in kernels/{filename}"
    assert list(types) == declared[name], name

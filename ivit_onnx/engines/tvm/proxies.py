"""GPU speed proxies read from a CUDA build without a GPU: launches, tensor-core GEMMs, int32 GEMM outputs
in global memory, 64-bit integer divisions in the PTX.

The VM's bytecode (``executable.as_text()``) lists the calls of one forward; every call that is not a
``vm.builtin`` runs the device kernels TVM generated for that function (``<name>_kernel``,
``<name>_kernel_<i>``). GEMMs are the called functions named after matmul/conv (Relax names a fused
function after its ops); a GEMM is on int8 tensor cores when one of its kernels holds an int8
``wmma``/``mma`` fragment or instruction, and writes int32 to global memory when one of its kernels stores
to an ``int*`` parameter. PTX counts come from :func:`.cuda.to_ptx`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_KERNEL_DEF = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)\s*\{')
_PARAM = re.compile(r"([\w:]+(?: [\w:]+)*)\*\s*(?:__restrict__\s*)?(\w+)")
_CALL = re.compile(r"^\s*call\s+(\S+)\s+in:", re.M)
_GEMM_NAME = re.compile(r"(?:^|_)(?:matmul|conv\d?d|dense|batch_matmul)\d*(?:_|$)")
_INT8_TC = re.compile(r"wmma::fragment<[^>]*(?:(?:un)?signed char|uchar)|mma\.sync[\w.]*\.[su]8|__imma")
_DIV64 = re.compile(r"\b(?:div|rem)\.[su]64\b")
_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")


@dataclass
class Kernel:
    """One ``__global__`` function of the CUDA source."""

    name: str
    params: dict[str, str]
    body: str

    def stored_types(self) -> set[str]:
        """Element types of the pointer parameters this kernel writes (plain, vector or wmma stores)."""
        types = set()
        for line in self.body.splitlines():
            lhs = line if "store_matrix_sync" in line else _lhs(line)
            if lhs:
                types |= {t for p, t in self.params.items() if re.search(rf"\b{p}\b", lhs)}
        return types


def _lhs(line: str) -> str:
    """The left side of an assignment on ``line`` (``a[i] = ...``), else ''."""
    m = re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", line)
    return line[: m.start()] if m else ""


def kernels(source: str) -> dict[str, Kernel]:
    """The kernels defined in a CUDA source, by name (bodies up to the matching brace)."""
    found = {}
    for m in _KERNEL_DEF.finditer(source):
        depth, i = 1, m.end()
        while depth and i < len(source):
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
        params = {p.group(2): p.group(1).strip() for p in _PARAM.finditer(m.group(2))}
        found[m.group(1)] = Kernel(m.group(1), params, source[m.end() : i])
    return found


_GRAPH = re.compile(r"vm\.builtin\.cuda_graph\.run_or_capture\s+in:\s*%vm,\s*f\[(\w+)\]")


def _function_body(vm_text: str, name: str) -> str:
    start = vm_text.find(f"@{name}:")
    if start < 0:
        return ""
    nxt = vm_text.find("\n@", start + 1)
    return vm_text[start:] if nxt < 0 else vm_text[start:nxt]


def forward_calls(vm_text: str, captured: list | None = None) -> list[str]:
    """Names of the functions one forward calls, in order, ``vm.builtin.*`` left out; the calls of a
    CUDA-graph capture function (``relax.backend.use_cuda_graph``) are expanded in place and, when
    ``captured`` is a list, also appended to it (one list of names per replayed graph)."""
    out = []
    for line in _function_body(vm_text, "main").splitlines():
        graph = _GRAPH.search(line)
        if graph:
            calls = [
                c
                for c in _CALL.findall(_function_body(vm_text, graph.group(1)))
                if not c.startswith("vm.builtin")
            ]
            out += calls
            if captured is not None:
                captured.append(calls)
            continue
        call = _CALL.match(line)
        if call and not call.group(1).startswith("vm.builtin"):
            out.append(call.group(1))
    return out


def div64_per_kernel(ptx: str) -> dict[str, int]:
    """64-bit integer div/rem instructions per PTX entry (kernels without any left out)."""
    counts = {}
    entries = list(_ENTRY.finditer(ptx))
    for m, nxt in zip(entries, entries[1:] + [None], strict=True):
        n = len(_DIV64.findall(ptx[m.end() : nxt.start() if nxt else len(ptx)]))
        if n:
            counts[m.group(1)] = n
    return counts


@dataclass
class Proxies:
    """The counts of one build (see the module doc)."""

    launches: int
    gemms: int
    int8_tc_gemms: int
    int32_gemm_outputs: int
    kernels: int
    div64: dict[str, int] = field(default_factory=dict)
    untraced: list[str] = field(default_factory=list)
    #: host-side launch calls: kernels outside CUDA graphs plus one per graph replay
    launch_calls: int = 0
    #: (function, on int8 tensor cores, writes int32) per GEMM call
    gemm_calls: list[tuple[str, bool, bool]] = field(default_factory=list)
    #: the functions one forward calls, in order (``vm.builtin`` left out)
    calls: list[str] = field(default_factory=list)

    @property
    def div64_total(self) -> int:
        return sum(self.div64.values())

    def row(self) -> dict:
        return {
            "launches": self.launches,
            "launch_calls": self.launch_calls,
            "gemms": self.gemms,
            "int8_tc_gemms": self.int8_tc_gemms,
            "int32_gemm_outputs": self.int32_gemm_outputs,
            "kernels": self.kernels,
            "div64_total": self.div64_total,
            "div64_kernels": len(self.div64),
        }


def _kernels_of(name: str, by_name: dict[str, Kernel]) -> list[Kernel]:
    pattern = re.compile(rf"{re.escape(name)}_kernel(?:_\d+)?")
    return [k for n, k in by_name.items() if pattern.fullmatch(n)]


def measure(vm_text: str, source: str, ptx: str | None = None) -> Proxies:
    """Proxies of a build from its VM bytecode, CUDA source and (optionally) PTX."""
    by_name = kernels(source)
    launches = 0
    untraced, gemm_calls, graphs = [], [], []
    calls = forward_calls(vm_text, graphs)
    for call in calls:
        ks = _kernels_of(call, by_name)
        if not ks:
            untraced.append(call)  # a host function or a library call: no kernel of ours
        launches += len(ks)
        if _GEMM_NAME.search(call):
            tc = any(_INT8_TC.search(k.body) for k in ks)
            gemm_calls.append((call, tc, any("int" in k.stored_types() for k in ks)))
    tc, i32 = sum(g[1] for g in gemm_calls), sum(g[2] for g in gemm_calls)
    div64 = div64_per_kernel(ptx) if ptx else {}
    in_graphs = sum(len(_kernels_of(c, by_name)) for calls in graphs for c in calls)
    launch_calls = launches - in_graphs + len(graphs)
    return Proxies(
        launches, len(gemm_calls), tc, i32, len(by_name), div64, untraced, launch_calls, gemm_calls, calls
    )


__all__ = ["Kernel", "Proxies", "div64_per_kernel", "forward_calls", "kernels", "measure"]

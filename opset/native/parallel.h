// How the native kernels (kernels.cpp) spread a loop over threads: by default each call starts its own
// threads; a host with a thread pool (the onnxruntime custom ops, ort_ops.cpp) sets a hook for the
// calling thread, and the kernels then hand their chunks to that pool instead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ivit {

// run(ctx, fn, total, data) calls fn(data, i) once for every i in [0, total), in any order and on any
// threads, and returns when all calls have returned.
struct ParallelHook {
  void (*run)(void* ctx, void (*fn)(void*, size_t), size_t total, void* data);
  void* ctx;
};

// Most chunks a kernel hands to a hook (enough to balance a pool of up to 64 threads).
constexpr int64_t MAX_TASKS = 64;

ParallelHook parallel_hook();                      // the calling thread's hook ({} when none)
ParallelHook set_parallel_hook(ParallelHook hook);  // set it; returns the previous one

}  // namespace ivit

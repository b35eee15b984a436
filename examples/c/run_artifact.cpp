// Run a compiled onnxruntime artifact (int.onnx with the engine's rewrites, ivit_onnx.engines.onnxruntime)
// from C++ through onnxruntime's C API alone: no Python, no onnxruntime headers. The C ABI is declared the
// way the custom-op library declares it (opset/native/ort_abi.h: function-table positions and signatures),
// and the program links against the libonnxruntime shipped in the onnxruntime wheel (README.md).
//
//   run_artifact MODEL.onnx LIBRARY.so INPUT.bin OUTPUT.bin N [THREADS]
//
// registers the custom-op library (ivit_onnx/opset/_kernels*.so) with the session options, creates the
// session, feeds INPUT.bin (raw float32, the model's one input with batch dimension N), runs it and writes
// its one output to OUTPUT.bin (raw float32). Prints one line with the output's name and shape; any
// onnxruntime error prints one line and exits 1. Linux (ORTCHAR_T is char; wchar_t on Windows).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../opset/native/ort_abi.h"

namespace ort {
struct Allocator;  // OrtAllocator, only ever handled by pointer
}

extern "C" const ort::ApiBase* OrtGetApiBase(void) noexcept;  // libonnxruntime's one exported function

namespace {

const ort::Api* g_api = nullptr;

template <class Sig>
Sig* api(ort::Slot s) { return g_api->fn<Sig>(s); }

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "run_artifact: %s\n", msg.c_str());
  std::exit(1);
}

// Exit with onnxruntime's message if `s` is an error.
void check(ort::Status* s, const char* what) {
  if (!s) return;
  std::string msg = api<const char*(const ort::Status*)>(ort::GetErrorMessage)(s);
  api<void(ort::Status*)>(ort::ReleaseStatus)(s);
  fail(std::string(what) + ": " + msg);
}

std::vector<int64_t> dims_of(const ort::TensorInfo* info, const char* what) {
  ort::ElemType type = ort::UNDEFINED;
  check(api<ort::Status*(const ort::TensorInfo*, ort::ElemType*)>(ort::GetTensorElementType)(info, &type), what);
  if (type != ort::FLOAT) fail(std::string(what) + ": not float32 (element type " + std::to_string(type) + ")");
  size_t rank = 0;
  check(api<ort::Status*(const ort::TensorInfo*, size_t*)>(ort::GetDimensionsCount)(info, &rank), what);
  std::vector<int64_t> dims(rank);
  check(api<ort::Status*(const ort::TensorInfo*, int64_t*, size_t)>(ort::GetDimensions)(info, dims.data(), rank),
        what);
  return dims;
}

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) fail("usage: run_artifact MODEL.onnx LIBRARY.so INPUT.bin OUTPUT.bin N [THREADS]");
  const char *model_path = argv[1], *library = argv[2], *input_path = argv[3], *output_path = argv[4];
  const long n = std::strtol(argv[5], nullptr, 10);
  const int threads = argc == 7 ? std::atoi(argv[6]) : 0;  // 0: onnxruntime's default
  if (n <= 0) fail("N must be a positive batch size");

  const ort::ApiBase* base = OrtGetApiBase();
  g_api = base->GetApi(ort::API_VERSION);
  if (!g_api) fail(std::string("onnxruntime ") + base->GetVersionString() + " does not serve ORT API version " +
                   std::to_string(ort::API_VERSION));

  // Environment, options (the custom-op library registered with them: onnxruntime dlopens it and calls its
  // RegisterCustomOps, which also runs the library's GEMM self-check), session.
  ort::Env* env = nullptr;
  check(api<ort::Status*(int, const char*, ort::Env**)>(ort::CreateEnv)(3 /* errors */, "run_artifact", &env),
        "CreateEnv");
  ort::SessionOptions* opts = nullptr;
  check(api<ort::Status*(ort::SessionOptions**)>(ort::CreateSessionOptions)(&opts), "CreateSessionOptions");
  if (threads > 0)
    check(api<ort::Status*(ort::SessionOptions*, int)>(ort::SetIntraOpNumThreads)(opts, threads), "threads");
  check(api<ort::Status*(ort::SessionOptions*, const char*)>(ort::RegisterCustomOpsLibrary_V2)(opts, library),
        library);
  ort::Session* session = nullptr;
  check(api<ort::Status*(const ort::Env*, const char*, const ort::SessionOptions*, ort::Session**)>(
            ort::CreateSession)(env, model_path, opts, &session),
        model_path);

  // The model's one input and one output.
  size_t n_in = 0, n_out = 0;
  check(api<ort::Status*(const ort::Session*, size_t*)>(ort::SessionGetInputCount)(session, &n_in), "inputs");
  check(api<ort::Status*(const ort::Session*, size_t*)>(ort::SessionGetOutputCount)(session, &n_out), "outputs");
  if (n_in != 1 || n_out != 1) fail("the model must have one input and one output");
  ort::Allocator* alloc = nullptr;
  check(api<ort::Status*(ort::Allocator**)>(ort::GetAllocatorWithDefaultOptions)(&alloc), "allocator");
  using NameFn = ort::Status*(const ort::Session*, size_t, ort::Allocator*, char**);
  char *in_name = nullptr, *out_name = nullptr;
  check(api<NameFn>(ort::SessionGetInputName)(session, 0, alloc, &in_name), "input name");
  check(api<NameFn>(ort::SessionGetOutputName)(session, 0, alloc, &out_name), "output name");

  // The input's shape as declared, with the batch dimension set to N; then the input file, of exactly that size.
  ort::TypeInfo* in_type = nullptr;
  check(api<ort::Status*(const ort::Session*, size_t, ort::TypeInfo**)>(ort::SessionGetInputTypeInfo)(session, 0,
                                                                                                      &in_type),
        "input type");
  const ort::TensorInfo* in_info = nullptr;  // owned by in_type
  check(api<ort::Status*(const ort::TypeInfo*, const ort::TensorInfo**)>(ort::CastTypeInfoToTensorInfo)(in_type,
                                                                                                       &in_info),
        "input type");
  std::vector<int64_t> in_dims = dims_of(in_info, in_name);
  api<void(ort::TypeInfo*)>(ort::ReleaseTypeInfo)(in_type);
  if (in_dims.empty()) fail(std::string(in_name) + ": a scalar input has no batch dimension");
  in_dims[0] = n;
  size_t in_count = 1;
  for (int64_t d : in_dims) {
    if (d <= 0) fail(std::string(in_name) + ": dimension other than the batch not fixed: " + shape_text(in_dims));
    in_count *= static_cast<size_t>(d);
  }
  std::vector<float> x(in_count);
  FILE* f = std::fopen(input_path, "rb");
  if (!f) fail(std::string("cannot read ") + input_path);
  const size_t got = std::fread(x.data(), sizeof(float), in_count, f);
  const bool extra = std::fgetc(f) != EOF;
  std::fclose(f);
  if (got != in_count || extra)
    fail(std::string(input_path) + ": expected exactly " + std::to_string(in_count * sizeof(float)) +
         " bytes (float32 " + shape_text(in_dims) + ")");

  // Run: the input wraps our buffer, onnxruntime allocates the output.
  ort::MemoryInfo* mem = nullptr;
  check(api<ort::Status*(int, int, ort::MemoryInfo**)>(ort::CreateCpuMemoryInfo)(1 /* arena */, 0 /* default */,
                                                                                 &mem),
        "CreateCpuMemoryInfo");
  ort::Value* input = nullptr;
  check(api<ort::Status*(const ort::MemoryInfo*, void*, size_t, const int64_t*, size_t, ort::ElemType,
                         ort::Value**)>(ort::CreateTensorWithDataAsOrtValue)(
            mem, x.data(), x.size() * sizeof(float), in_dims.data(), in_dims.size(), ort::FLOAT, &input),
        "input tensor");
  ort::Value* output = nullptr;
  check(api<ort::Status*(ort::Session*, const void*, const char* const*, const ort::Value* const*, size_t,
                         const char* const*, size_t, ort::Value**)>(ort::Run)(session, nullptr, &in_name, &input, 1,
                                                                               &out_name, 1, &output),
        "Run");

  // The output: float32, its shape, its data written raw.
  ort::TensorInfo* out_info = nullptr;
  check(api<ort::Status*(const ort::Value*, ort::TensorInfo**)>(ort::GetTensorTypeAndShape)(output, &out_info),
        "output shape");
  const std::vector<int64_t> out_dims = dims_of(out_info, out_name);
  api<void(ort::TensorInfo*)>(ort::ReleaseTensorTypeAndShapeInfo)(out_info);
  size_t out_count = 1;
  for (int64_t d : out_dims) out_count *= static_cast<size_t>(d);
  void* y = nullptr;
  check(api<ort::Status*(ort::Value*, void**)>(ort::GetTensorMutableData)(output, &y), "output data");
  f = std::fopen(output_path, "wb");
  if (!f || std::fwrite(y, sizeof(float), out_count, f) != out_count || std::fclose(f) != 0)
    fail(std::string("cannot write ") + output_path);
  std::printf("%s: float32 %s -> %s\n", out_name, shape_text(out_dims).c_str(), output_path);

  using FreeFn = ort::Status*(ort::Allocator*, void*);
  check(api<FreeFn>(ort::AllocatorFree)(alloc, in_name), "free");
  check(api<FreeFn>(ort::AllocatorFree)(alloc, out_name), "free");
  api<void(ort::Value*)>(ort::ReleaseValue)(output);
  api<void(ort::Value*)>(ort::ReleaseValue)(input);
  api<void(ort::MemoryInfo*)>(ort::ReleaseMemoryInfo)(mem);
  api<void(ort::Session*)>(ort::ReleaseSession)(session);
  api<void(ort::SessionOptions*)>(ort::ReleaseSessionOptions)(opts);
  api<void(ort::Env*)>(ort::ReleaseEnv)(env);
  return 0;
}

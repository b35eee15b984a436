// The part of onnxruntime's C ABI (onnxruntime_c_api.h) that the ai.ivit custom-op library uses,
// declared here because no onnxruntime header can be had on the build machines (FACTS.md).
//
// onnxruntime hands a custom-op library an OrtApiBase; OrtApiBase::GetApi(version) returns the function
// table (OrtApi) as it stood at that API version, or NULL when the runtime does not serve that version.
// The table is append-only: a function keeps its position forever, so a position, once shipped, is
// stable across every later release. Positions below were counted from onnxruntime's own table
// (core/session/onnxruntime_c_api.cc, whose static_asserts pin the last slot of every version: 101 for
// version 1, 224 for 13, 238 for 14, 254 for 15, 265 for 16); version 17 appended
// SetUserLoggingFunction (266), the ShapeInferContext functions (267-270), SetSymbolicDimensions,
// ReadOpAttr, SetDeterministicCompute and KernelContext_ParallelFor (274).
//
// The library targets API version 17 (onnxruntime 1.17, the first with KernelContext_ParallelFor);
// OrtCustomOp::version tells onnxruntime which fields of the struct below exist.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ort {

constexpr uint32_t API_VERSION = 17;

struct Status;  // opaque onnxruntime objects, only ever handled by pointer
struct SessionOptions;
struct CustomOpDomain;
struct KernelInfo;
struct KernelContext;
struct Value;
struct TypeInfo;
struct TensorInfo;  // OrtTensorTypeAndShapeInfo
struct ShapeInferContext;
struct Env;  // used by the GEMM self-check (gemm_check.cpp), which runs a probe session
struct Session;
struct MemoryInfo;

enum ErrorCode : int { OK = 0, FAIL = 1, INVALID_ARGUMENT = 2 };

// ONNXTensorElementDataType (the TensorProto data types)
enum ElemType : int { UNDEFINED = 0, FLOAT = 1, UINT8 = 2, INT8 = 3, UINT16 = 4, INT16 = 5, INT32 = 6, INT64 = 7 };

enum Characteristic : int { REQUIRED = 0, OPTIONAL = 1, VARIADIC = 2 };  // OrtCustomOpInputOutputCharacteristic

struct Api;  // the function table, accessed by position (Api::fn below)

struct ApiBase {  // OrtApiBase: two function pointers, never versioned
  const Api* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

// Positions in the OrtApi table of the functions this library calls, with their signatures.
enum Slot : int {
  CreateStatus = 0,                   // Status*(ErrorCode, const char* msg)
  GetErrorMessage = 2,                // const char*(const Status*)
  CreateEnv = 3,                      // Status*(int log_level, const char* logid, Env** out): the existing env, if any
  CreateSessionFromArray = 8,         // Status*(const Env*, const void* data, size_t len, const SessionOptions*, Session**)
  Run = 9,                            // Status*(Session*, const void* run_options, const char* const* in_names,
                                      //         const Value* const* inputs, size_t n_in, const char* const* out_names,
                                      //         size_t n_out, Value** outputs)
  SetOptimizedModelFilePath = 11,     // Status*(SessionOptions*, const char* path)  (ORTCHAR_T: wchar_t on Windows)
  CloneSessionOptions = 12,           // Status*(const SessionOptions*, SessionOptions** out)
  DisableProfiling = 15,              // Status*(SessionOptions*)
  SetIntraOpNumThreads = 24,          // Status*(SessionOptions*, int)
  CreateCustomOpDomain = 26,          // Status*(const char* domain, CustomOpDomain** out)
  CustomOpDomain_Add = 27,            // Status*(CustomOpDomain*, const CustomOp*)
  AddCustomOpDomain = 28,             // Status*(SessionOptions*, CustomOpDomain*)
  CreateTensorWithDataAsOrtValue = 49, // Status*(const MemoryInfo*, void* data, size_t bytes, const int64_t* shape,
                                       //         size_t rank, ElemType, Value** out)
  GetTensorMutableData = 51,          // Status*(Value*, void** out)
  CastTypeInfoToTensorInfo = 55,      // Status*(const TypeInfo*, const TensorInfo** out)
  GetTensorElementType = 60,          // Status*(const TensorInfo*, ElemType* out)
  GetDimensionsCount = 61,            // Status*(const TensorInfo*, size_t* out)
  GetDimensions = 62,                 // Status*(const TensorInfo*, int64_t* dims, size_t count)
  GetTensorTypeAndShape = 65,         // Status*(const Value*, TensorInfo** out)
  CreateCpuMemoryInfo = 69,           // Status*(int allocator_type, int mem_type, MemoryInfo** out)
  KernelInfoGetAttribute_int64 = 86,  // Status*(const KernelInfo*, const char* name, int64_t* out)
  KernelContext_GetInputCount = 88,   // Status*(const KernelContext*, size_t* out)
  KernelContext_GetInput = 90,        // Status*(const KernelContext*, size_t index, const Value** out)
  KernelContext_GetOutput = 91,       // Status*(KernelContext*, size_t index, const int64_t* dims, size_t count, Value** out)
  ReleaseEnv = 92,                    // void(Env*)
  ReleaseStatus = 93,                 // void(Status*)
  ReleaseMemoryInfo = 94,             // void(MemoryInfo*)
  ReleaseSession = 95,                // void(Session*)
  ReleaseValue = 96,                  // void(Value*)
  ReleaseTypeInfo = 98,               // void(TypeInfo*)
  ReleaseTensorTypeAndShapeInfo = 99, // void(TensorInfo*)
  ReleaseSessionOptions = 100,        // void(SessionOptions*)
  AddSessionConfigEntry = 130,        // Status*(SessionOptions*, const char* key, const char* value)  (version 5)
  KernelInfo_GetInputCount = 230,     // Status*(const KernelInfo*, size_t* out)            (version 14)
  KernelInfo_GetInputTypeInfo = 234,  // Status*(const KernelInfo*, size_t index, TypeInfo** out)
  HasSessionConfigEntry = 237,        // Status*(const SessionOptions*, const char* key, int* out)   (version 14)
  GetSessionConfigEntry = 238,        // Status*(const SessionOptions*, const char* key, char* out, size_t* size)
  KernelInfo_GetNodeName = 244,       // Status*(const KernelInfo*, char* out, size_t* size) (version 15)
  KernelInfo_GetLogger = 245,         // Status*(const KernelInfo*, const Logger** out)  (version 15; the session's)
  KernelContext_ParallelFor = 274,    // (version 17) Status*(const KernelContext*, void (*fn)(void*, size_t), size_t total,
                                      //         size_t num_batch, void* data)
  // used by the C example that runs a compiled artifact (examples/c/run_artifact.cpp); Allocator is OrtAllocator
  CreateSession = 7,                  // Status*(const Env*, const char* model_path, const SessionOptions*, Session**)
                                      //         (ORTCHAR_T: wchar_t on Windows)
  CreateSessionOptions = 10,          // Status*(SessionOptions** out)
  SessionGetInputCount = 30,          // Status*(const Session*, size_t* out)
  SessionGetOutputCount = 31,         // Status*(const Session*, size_t* out)
  SessionGetInputTypeInfo = 33,       // Status*(const Session*, size_t index, TypeInfo** out)
  SessionGetInputName = 36,           // Status*(const Session*, size_t index, Allocator*, char** out)
  SessionGetOutputName = 37,          // Status*(const Session*, size_t index, Allocator*, char** out)
  AllocatorFree = 76,                 // Status*(Allocator*, void* p)
  GetAllocatorWithDefaultOptions = 78, // Status*(Allocator** out): onnxruntime's, never released
  RegisterCustomOpsLibrary_V2 = 228,  // Status*(SessionOptions*, const char* library_path)  (version 14; ORTCHAR_T)
};

struct Api {
  const void* slots[275];
  template <class Sig>
  Sig* fn(Slot s) const { return reinterpret_cast<Sig*>(const_cast<void*>(slots[s])); }
};

struct CustomOp;

// OrtCustomOp as of API version 17 (fields up to GetEndVersion); onnxruntime reads only the fields that
// exist at `version`. The four fields of version 18+ are declared (and left NULL) so that the struct has
// the size every newer reader might assume.
struct CustomOp {
  uint32_t version;
  void* (*CreateKernel)(const CustomOp*, const Api*, const KernelInfo*);
  const char* (*GetName)(const CustomOp*);
  const char* (*GetExecutionProviderType)(const CustomOp*);
  ElemType (*GetInputType)(const CustomOp*, size_t index);
  size_t (*GetInputTypeCount)(const CustomOp*);
  ElemType (*GetOutputType)(const CustomOp*, size_t index);
  size_t (*GetOutputTypeCount)(const CustomOp*);
  void (*KernelCompute)(void* kernel, KernelContext*);
  void (*KernelDestroy)(void* kernel);
  Characteristic (*GetInputCharacteristic)(const CustomOp*, size_t index);   // version 8
  Characteristic (*GetOutputCharacteristic)(const CustomOp*, size_t index);  // version 8
  int (*GetInputMemoryType)(const CustomOp*, size_t index);                   // version 13 (OrtMemType)
  int (*GetVariadicInputMinArity)(const CustomOp*);                           // version 14
  int (*GetVariadicInputHomogeneity)(const CustomOp*);
  int (*GetVariadicOutputMinArity)(const CustomOp*);
  int (*GetVariadicOutputHomogeneity)(const CustomOp*);
  Status* (*CreateKernelV2)(const CustomOp*, const Api*, const KernelInfo*, void** kernel);  // version 16
  Status* (*KernelComputeV2)(void* kernel, KernelContext*);
  Status* (*InferOutputShapeFn)(const CustomOp*, ShapeInferContext*);  // version 17
  int (*GetStartVersion)(const CustomOp*);
  int (*GetEndVersion)(const CustomOp*);
  void* reserved_v18_plus[4];  // GetMayInplace, ReleaseMayInplace, GetAliasMap, ReleaseAliasMap
};

}  // namespace ort

// A read-only view of an onnxruntime tensor (element type, shape, data) and its reader through the C API,
// shared by the opset's custom ops (ort_ops.cpp) and the engine's fused GEMM op (qgemm_op.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "ort_abi.h"

namespace ivit {

struct OrtTensor {
  int elem = 0;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t size = 1;
  int64_t at(int64_t i) const {  // element i as int64
    switch (elem) {
      case ort::INT8: return static_cast<const int8_t*>(data)[i];
      case ort::UINT8: return static_cast<const uint8_t*>(data)[i];
      case ort::INT16: return static_cast<const int16_t*>(data)[i];
      case ort::INT32: return static_cast<const int32_t*>(data)[i];
      default: return static_cast<const int64_t*>(data)[i];
    }
  }
};

// onnx element type -> dtype code of kernels.h (int8, uint8, int16, int32), -1 if not an opset int type
inline int kernel_code(int elem) {
  switch (elem) {
    case ort::INT8: return 0;
    case ort::UINT8: return 1;
    case ort::INT16: return 2;
    case ort::INT32: return 3;
    default: return -1;
  }
}

// The view of ``v``; ``check`` turns a non-null onnxruntime status into the caller's exception.
template <class Check>
OrtTensor read_tensor(const ort::Api* table, const ort::Value* v, Check check) {
  ort::TensorInfo* info = nullptr;
  check(table->fn<ort::Status*(const ort::Value*, ort::TensorInfo**)>(ort::GetTensorTypeAndShape)(v, &info));
  OrtTensor t;
  size_t rank = 0;
  ort::ElemType elem{};
  ort::Status* s = table->fn<ort::Status*(const ort::TensorInfo*, ort::ElemType*)>(ort::GetTensorElementType)(info, &elem);
  if (!s) s = table->fn<ort::Status*(const ort::TensorInfo*, size_t*)>(ort::GetDimensionsCount)(info, &rank);
  t.shape.resize(rank);
  if (!s) {
    s = table->fn<ort::Status*(const ort::TensorInfo*, int64_t*, size_t)>(ort::GetDimensions)(info, t.shape.data(),
                                                                                               rank);
  }
  table->fn<void(ort::TensorInfo*)>(ort::ReleaseTensorTypeAndShapeInfo)(info);
  check(s);
  void* data = nullptr;
  check(table->fn<ort::Status*(ort::Value*, void**)>(ort::GetTensorMutableData)(const_cast<ort::Value*>(v), &data));
  t.elem = elem;
  t.data = data;
  for (int64_t d : t.shape) t.size *= d;
  return t;
}

}  // namespace ivit

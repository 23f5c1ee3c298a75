// The torch-facing kernels of cpu_kernels.cpp, for the other translation units of the extension.
#pragma once
#include <torch/extension.h>
#include <optional>

torch::Tensor q4q8_mm(torch::Tensor x, torch::Tensor packed);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
void lowrank_add(torch::Tensor y, torch::Tensor x, torch::Tensor a, torch::Tensor bt, int64_t start);
torch::Tensor decode_pre(torch::Tensor h, torch::Tensor norm, double eps, torch::Tensor qkv,
                         std::optional<torch::Tensor> bias, std::optional<torch::Tensor> lora_a,
                         std::optional<torch::Tensor> lora_bt, int64_t lora_start, torch::Tensor cos,
                         torch::Tensor sin, int64_t rope_cols);
torch::Tensor decode_post(torch::Tensor h, torch::Tensor attn, std::vector<torch::Tensor> packed,
                          std::vector<std::optional<torch::Tensor>> biases, std::vector<std::optional<torch::Tensor>> lora_a,
                          std::vector<std::optional<torch::Tensor>> lora_bt, std::vector<int64_t> lora_start,
                          torch::Tensor norm, double eps, int64_t intermediate);
torch::Tensor decode_rows(torch::Tensor qkv, int64_t heads, int64_t layer, std::vector<torch::Tensor> own_k,
                          std::vector<torch::Tensor> own_v, std::vector<int64_t> pos,
                          std::vector<std::vector<torch::Tensor>> chunk_k, std::vector<std::vector<torch::Tensor>> chunk_v,
                          double scale);
void kv_rows_into(torch::Tensor out, pybind11::buffer src, bool token_major, std::optional<torch::Tensor> cos,
                  std::optional<torch::Tensor> sin, int64_t start);
void kv_rows_many(torch::Tensor out, std::vector<pybind11::buffer> srcs, std::vector<bool> token_major,
                  std::vector<int64_t> starts, std::optional<torch::Tensor> cos, std::optional<torch::Tensor> sin,
                  std::vector<bool> widen);
bool prefill_attention_available();
torch::Tensor prefill_attention(torch::Tensor q, std::vector<torch::Tensor> ks, std::vector<torch::Tensor> vs,
                                std::optional<torch::Tensor> mask, bool causal, double scale);
bool train_softmax_available();
void masked_softmax_bf16_(torch::Tensor s, torch::Tensor mask, int64_t heads);
void softmax_backward_bf16_(torch::Tensor grad, torch::Tensor probs);
bool train_elementwise_available();
torch::Tensor silu_mul_bf16(torch::Tensor gu, int64_t inter);
torch::Tensor silu_mul_backward_bf16(torch::Tensor grad, torch::Tensor gu);
std::vector<torch::Tensor> rms_norm_train(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor rms_norm_train_backward(torch::Tensor grad, torch::Tensor x, torch::Tensor w, torch::Tensor rstd);

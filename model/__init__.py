"""The GLM-5 network and its files. Knows nothing of serving or training.

Module map, in reading order (a forward goes top to bottom through the network part):
- special_tokens.py  the GLM-5 special tokens and their ids in glm5's shipped tokenizer
- config.py          GLM5Config (the keys of config.json), presets tiny / small / glm5, parameter and memory sums
- kernels/          fused CPU kernels behind one op each (`kernels.rms_norm`, `kernels.attend`, ...), each op with its
                     plain-PyTorch reference and one choice impl="torch" | "fused" (see kernels/__init__.py); the
                     network calls the ops and never a kernel
- norms.py           RMSNorm
- rope.py            interleaved RoPE (cos/sin from positions, rotation)
- indexer.py         the DSA lightning indexer: index keys, scores, causal top-k
- attention.py       MLA: q / latent projections, expanded (prefill, training) and absorbed (decode, sparse) paths
- moe.py             SwiGLU MLP, the sigmoid router with the selection-only bias, MoE (grouped fast path + plain)
- decoder_layer.py   one pre-norm decoder layer (MLA + MLP or MoE)
- mtp.py             the MTP layer (a decoder layer + enorm / hnorm / eh_proj / shared_head.norm)
- modeling.py        GLM5Model (trunk) and GLM5ForCausalLM (+ lm_head, mtp_forward, init, from/save_pretrained)
- kv_cache.py        a simple contiguous per-layer cache (c_kv, k_pe, index keys) for incremental decoding
- fp8.py             GLM-5-FP8's block format: dequantize / quantize float8_e4m3fn with 128 x 128 scales
- checkpoint.py      Hugging Face safetensors load (meta device, mmap, FP8 dequant, shards; a checkpoint without its
                     MTP layer loads without it; an INT4 one through int4_load.py) and save
- INT4 weight-only (W4A16), one way: each of these imports only those above it in this sub-list (and
  int4_write.py checkpoint.py's side_files; checkpoint.py imports int4_load.py):
  - compressed_tensors.py  the compressed-tensors pack-quantized format: int4 packing, Int4Tensors <-> a module's
                     checkpoint tensors, the quantization_config block, reading a checkpoint's tensors
  - int4_numerics.py   group-wise quantize / dequantize / fake-quantize of one weight (MSE range search)
  - int4_linear.py     Int4Linear: the layer (an int4 kernel, ours or torch's, + a plain dequantise path; a LoRA
                       adapter served beside it)
  - int4_gate_up.py    Int4GateUp / fuse_gate_up: an MLP's gate and up Int4Linears in one kernel call
  - quant_int4.py      the model swap: quantize_int4, round_like_int4, DEFAULT_SKIP (GLM-5's high-precision set)
  - int4_load.py       a compressed-tensors checkpoint into a model (apply_compressed_tensors, load_compressed_tensors)
  - int4_write.py      quantize_checkpoint: an unquantized checkpoint to a compressed-tensors one, tensor by tensor
- tokenizer.py       loads tokenizer.json (a checkpoint's or the shipped one), special ids by name; writes the
                     tokenizer files of a new checkpoint (save_tokenizer_files)
- chat.py            renders OpenAI messages in the GLM-5 chat format: text, ids, ids + loss masks for training
- chat_parse.py      parses GLM-5 completions into reasoning, content and tool calls; whole or streamed
- assets/            the shipped tokenizer.json (scripts/train_tokenizer.py) and chat_template.jinja

Life of a load: config.json -> GLM5Config -> GLM5ForCausalLM built on meta -> tensors assigned from safetensors
(an INT4 checkpoint: int4_load swaps an Int4Linear in for each packed module first, then assigns the rest).
A chat request: chat.render -> tokenizer.encode -> (the network generates) -> chat_parse.StreamParser.feed per
decoded delta -> OpenAI deltas; a stored trajectory: chat.render_for_training -> ids, message index, loss mask.
"""

from model.config import GLM5Config, preset
from model.kv_cache import KVCache
from model.modeling import GLM5ForCausalLM

__all__ = ["GLM5Config", "GLM5ForCausalLM", "KVCache", "preset"]

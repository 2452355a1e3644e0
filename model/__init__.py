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
                     MTP layer loads without it) and save
- quant_int4.py      INT4 weight-only: Int4Linear (an int4 kernel, ours or torch's, + a plain dequantise path),
                     quantize_int4, quantize / load compressed-tensors checkpoints
- compressed_tensors.py  the compressed-tensors pack-quantized (W4A16) format: packing, quantization_config
- tokenizer.py       loads tokenizer.json (a checkpoint's or the shipped one), special ids by name; writes the
                     tokenizer files of a new checkpoint (save_tokenizer_files)
- chat.py            renders OpenAI messages in the GLM-5 chat format: text, ids, ids + loss masks for training
- chat_parse.py      parses GLM-5 completions into reasoning, content and tool calls; whole or streamed
- assets/            the shipped tokenizer.json (scripts/train_tokenizer.py) and chat_template.jinja

Life of a load: config.json -> GLM5Config -> GLM5ForCausalLM built on meta -> tensors assigned from safetensors.
A chat request: chat.render -> tokenizer.encode -> (the network generates) -> chat_parse.StreamParser.feed per
decoded delta -> OpenAI deltas; a stored trajectory: chat.render_for_training -> ids, message index, loss mask.
"""

from model.config import GLM5Config, preset
from model.kv_cache import KVCache
from model.modeling import GLM5ForCausalLM

__all__ = ["GLM5Config", "GLM5ForCausalLM", "KVCache", "preset"]

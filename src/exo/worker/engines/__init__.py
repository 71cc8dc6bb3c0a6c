"""The inference engine: PyTorch models, one module per architecture family, that run a
contiguous range of layers (or a tensor-parallel slice of every layer).

Modules, bottom up:

* `config`, `gguf_reader`, `gguf_loader`, `safetensors_loader`, `weights`: model files to plain
  tensors (`ShardWeights`), one canonical layout whatever the file format.
* `models`: the model interface (`models.base.ModelFamily`: config, tensor names, tensor-parallel
  split, forward pass), the registry of families by GGUF architecture / HF `model_type`, the
  dense Llama family (`models.dense`; `llama.LlamaModel` is its former name) and the pieces
  families share (attention, MLP, norms, rotary tables, the MoE feed-forward and its routers;
  `models.qwen3moe`, `models.gpt_oss`); `kinds`: the one table of weight kinds (mirrored by
  `csrc/kinds.c`); `linear`, `rope`, `kv_cache`: layers, rotary maths, the paged cache;
  `cpu_kernels`: compiled quantised linear and decode-attention kernels (portable C, and x86
  builds picked by what the CPU has: AVX2, AVX-VNNI, AVX-512 VNNI; torch formats where none
  can run).
* `sampling`, `batch`: next-token choice and continuous batching (`BatchGenerator`).
* `tokenizer`, `text`: tokens to text (chat template, incremental detokenizer, stop strings).
* `engine`: the one loader for every shard kind (`load_model`, `load_engine`) and the facade
  the runner uses (`Engine`).

Of the rest of `exo` the engine imports only what it shares with placement and the API
(`exo.shared`: the served context, memory sizing, the request and tool types); it takes and
returns plain values.
"""

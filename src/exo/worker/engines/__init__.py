"""The inference engine: a PyTorch Llama-family model that runs a contiguous range of layers.

Modules, bottom up:

* `config`, `gguf_reader`, `gguf_loader`, `safetensors_loader`, `weights`: model files to plain
  tensors (`ShardWeights`), one canonical layout whatever the file format.
* `linear`, `rope`, `kv_cache`, `llama`: the model itself (`LlamaModel`), holding only its
  layer range, with `embed`, `forward_layers` and `head`; `cpu_kernels`: compiled 4/8-bit
  linear and decode-attention kernels for x86 CPUs (torch formats where they cannot run).
* `sampling`, `batch`: next-token choice and continuous batching (`BatchGenerator`).
* `tokenizer`, `text`: tokens to text (chat template, incremental detokenizer, stop strings).
* `engine`: the facade the runner uses (`load_engine`).

Nothing here imports the rest of `exo`: the engine takes and returns plain values.
"""

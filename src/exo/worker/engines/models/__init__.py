"""One module per architecture family behind one interface (`base.ModelFamily`), found by
`registry`; the pieces families share: `attention`, `mla` (DeepSeek's latent attention), `mlp`,
`moe` and `router`, `norms`, `rotary`, `linears`, and the metadata readers `gguf_meta`,
`hf_meta`. The families: dense Llama (`dense`, `dense_files`), Qwen3-MoE (`qwen3moe`), gpt-oss
(`gpt_oss`), DeepSeek V2 / V3 and Kimi K2 (`deepseek2`, `deepseek2_files`) and GLM-4.5
(`glm4moe`, `glm4moe_files`)."""

"""One module per architecture family behind one interface (`base.ModelFamily`), found by
`registry`; the pieces families share: `attention`, `mlp`, `norms`, `rotary`, `linears`, and
the metadata readers `gguf_meta`, `hf_meta`. Today: the dense Llama family (`dense`,
`dense_files`)."""

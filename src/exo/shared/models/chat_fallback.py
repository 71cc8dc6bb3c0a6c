"""The chat template a model without one is rendered with (the API shows it; the engine uses it)."""

# The rendering of a model whose files carry no chat template (as llama-server and Ollama
# fall back to one): the system text, then one "Role: text" line per message, then
# "Assistant:" for the answer.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% else %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

"""Long-lived objects kept out of Python's full garbage collections.

A full (generation 2) collection walks every object the collector tracks. A runner with a model
loaded holds ~200k of them (the tokenizer's vocabulary, the model's modules, the imported
libraries), and a node process about as many: one full collection took 30-160 ms on SmolLM2's
runner and node (Zen 4; logged with a gc callback), and the collector runs one whenever the
objects that survived younger collections reach a quarter of the old ones, at any moment of a
stream: that pause is every running stream's pause (and, in `bench/serve.py`'s client, a
pause in its measurements). After the freeze a full collection took 0.2-3 ms.

Objects that live as long as the process are moved once, when they exist, to the permanent
generation (`gc.freeze`): later collections walk only what came after them. Objects frozen are
still freed by reference counting; only cycles among them would stay, and they are the
process's own lifetime objects.
"""

import gc


def freeze_long_lived() -> int:
    """Collect what is garbage now, then leave every surviving object out of later collections.
    Returns how many objects the permanent generation holds."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

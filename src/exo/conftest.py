"""Suite-wide test settings.

The kernels' default activation format is 8 bits (EXO_ACTIVATIONS, cpu_kernels.py): as accurate
as llama.cpp's by bench/accuracy.py's measure, not within the ~1e-3-of-float bounds most kernel,
engine and API tests check. Those tests run the 16-bit path, set here for this process and the
runners it starts; the 8-bit path has its own tests (worker/engines/tests/test_engine_kernel_act8.py:
batched == alone, every build, the dequantised dot, the default when the variable is unset).
"""

import os

os.environ.setdefault("EXO_ACTIVATIONS", "16")

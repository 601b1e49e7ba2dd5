"""Test-session set-up shared by every test directory (loaded before any test module is imported)."""
import os

import torch

# Without a GPU, Triton kernels run in its interpreter. It must be on before triton.language is first imported,
# since Triton's own @jit helpers (tl.cdiv, ...) are decorated then: otherwise which test module happens to import
# triton first decides whether every interpreted kernel works.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

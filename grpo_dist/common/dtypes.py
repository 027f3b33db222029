"""The one table from config dtype names (`model.dtype`, a reward model's `dtype`) to torch dtypes.

float16 is here for a reward model, which only runs inference; `model.dtype` refuses it
(config/schema.py): nothing scales the learner's loss, and unscaled gradients underflow in float16.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

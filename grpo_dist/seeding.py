"""Random streams: every completion gets its own, derived from where it sits in the run.

    prompt_seed     = H(seed, step, position of the prompt in the step)
    completion_seed = H(prompt_seed, sample index within the group)

H is a keyed hash (BLAKE2b), so the streams are independent of one another, identical
prompts in one batch still get different completions, a step's streams never reappear in
another step, and a run is reproducible from its seed alone: no engine or worker keeps
random state that a resume would have to restore.
"""

from __future__ import annotations

import hashlib

_SEED_BITS = 63  # torch.Generator and vLLM take non-negative 64-bit seeds


def _hash(*parts: int) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8, person=b"grpo_dist").digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


def prompt_seed(seed: int, step: int, position: int) -> int:
    """The seed of the prompt at `position` in step `step` of a run seeded with `seed`."""
    return _hash(seed, step, position)


def completion_seed(prompt_seed: int, sample: int) -> int:
    """The seed of completion `sample` (0..G-1) of the prompt whose seed is `prompt_seed`."""
    return _hash(prompt_seed, sample)

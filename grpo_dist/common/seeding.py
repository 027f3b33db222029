"""Random streams: every completion gets its own, derived from where it sits in the run.

    prompt_seed     = H(seed, step, position of the prompt in the step)
    completion_seed = prompt_seed + sample index within the group
    turn_seed       = H(episode's completion_seed, turn)             (multi-turn episodes)

H is a keyed hash (BLAKE2b), so a step's streams never reappear in another step, identical
prompts in one batch still get different completions, and a run is reproducible from its
seed alone: no engine or worker keeps random state that a resume would have to restore.

Completion j's seed is its prompt's plus j because that is how vLLM seeds the samples of one
request with n=G (the j-th child gets seed + j; tests/test_vllm_engine.py holds vLLM to it):
one request per prompt then samples exactly these streams, at a fraction of the per-request
cost of G requests. Two prompts' streams could meet only if their hashes lay within G of
each other: about G * prompts**2 / 2**63, nil for any run. A turn's seed is hashed again, since
episode j's turn t + 1 and episode j + 1's turn t would otherwise share a stream.
"""

from __future__ import annotations

import hashlib

# torch.Generator and vLLM take non-negative 64-bit seeds; hashes keep to 62 bits so that a
# prompt's seed plus a sample index never wraps
_SEED_BITS = 62


def _hash(*parts: int | str) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8, person=b"grpo_dist").digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


def prompt_seed(seed: int, step: int, position: int) -> int:
    """The seed of the prompt at `position` in step `step` of a run seeded with `seed`."""
    return _hash(seed, step, position)


def completion_seed(prompt_seed: int, sample: int) -> int:
    """The seed of completion `sample` (0..G-1) of the prompt whose seed is `prompt_seed`."""
    return prompt_seed + sample


def turn_seed(episode_seed: int, turn: int) -> int:
    """The seed of turn `turn` (0, 1, ...) of the episode whose seed is `episode_seed`."""
    return _hash(episode_seed, "turn", turn)

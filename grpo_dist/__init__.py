"""grpo_dist: GRPO post-training of language models on Ray, one workstation to a cluster."""

__version__ = "0.1.0"

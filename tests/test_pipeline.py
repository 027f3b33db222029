"""The rollout pipeline on a real local Ray cluster: versions, the version guard, timeouts, the driver's memory.

Two rollout workers with the transformers engine, one reward actor, the real learner.
"""

import os
import time
import tracemalloc

import pytest
import ray

from conftest import small_config
from grpo_dist.controller.batches import combine
from grpo_dist.controller.errors import ChunkFailed
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.controller.evaluator import Evaluator
from grpo_dist.controller.run import TrainingRun
from grpo_dist.weights.checksum import state_checksum
from grpo_dist.observe.metrics import MetricsLog

GROUP = 4


@pytest.fixture(scope="module")
def trainer(ray_cluster, tmp_path_factory):
    config = small_config(tmp_path_factory.mktemp("runs"), "rollout.engine=transformers", "rollout.chunk_prompts=2")
    trainer = TrainingRun(config, run_dir=tmp_path_factory.mktemp("run"))
    trainer.start()
    trainer.loop.step(1)  # the learner is at version 1, and so is every engine
    yield trainer
    trainer.stop()


def relabel(trainer, worker: int, version: int) -> None:
    """Make a worker report `version` while serving the learner's weights (a stand-in for a
    worker that restarted between two calls: tests/test_recovery.py kills one for real)."""
    weights = trainer.actors.learner.export_weights.remote()
    ray.get(trainer.actors.rollouts[worker].load_weights.remote(weights, version))


def submit(trainer, prompts: int = 8):
    loop = trainer.loop
    return loop.pipeline.submit(77, loop.cursor.next_batch(prompts), loop.sampling, loop.version)


def test_chunks_alternate_workers_and_every_group_carries_its_version(trainer):
    batch = submit(trainer)
    assert [c.worker for c in batch.chunks] == [0, 0, 1, 1]  # contiguous shares, 2 prompts a chunk
    scored = trainer.loop.pipeline.collect(batch, trainer.loop.version)
    assert scored.versions == [1] * 4 and scored.metrics["rollout/staleness_max"] == 0
    groups = [g for chunk in ray.get(scored.group_refs) for g in chunk]
    assert [g.prompt_index for g in groups] == [p.index for c in batch.chunks for p in c.prompts]
    assert {g.policy_version for g in groups} == {1} and all(len(g.rewards) == GROUP for g in groups)
    assert scored.metrics["reward/exact_answer/failures"] == 0.0
    assert 0 <= scored.metrics["reward/accuracy"] <= 1 and scored.metrics["rollout/dropped_stale"] == 0


def test_a_chunk_sampled_by_other_weights_is_generated_again_after_the_current_weights(trainer):
    relabel(trainer, 1, 0)  # worker 1 now claims version 0, as a restarted engine would
    retries = trainer.loop.counters["rollout/retries"]
    batch = submit(trainer)
    scored = trainer.loop.pipeline.collect(batch, trainer.loop.version)
    assert scored.versions == [1] * 4, "worker 1 got version 1 again, then generated its chunks again"
    assert [c.worker for c in batch.chunks] == [0, 0, 1, 1]
    assert scored.metrics["rollout/dropped_stale"] == 4.0  # groups
    assert trainer.loop.counters["rollout/retries"] == retries + 2  # chunks
    assert {g.policy_version for chunk in ray.get(scored.group_refs) for g in chunk} == {1}
    trainer.publisher.verify_through(trainer.loop.version)  # the repair's push: the learner's weights, verified
    assert not trainer.publisher.pending and trainer.loop.counters["rollout/restarts"] == 0  # no process died


def test_a_later_round_of_a_step_continues_its_positions_and_the_rounds_combine(trainer):
    """Dynamic sampling's extra rounds: seeds prompt_seed(seed, step, position) with positions
    after the earlier rounds', chunk numbers after theirs; one step's metrics over every round."""
    first = submit(trainer, 4)
    loop = trainer.loop
    later = loop.pipeline.submit(77, loop.cursor.next_batch(3), loop.sampling, loop.version, after=first)
    assert (later.first_position, later.end) == (4, 7) and [c.index for c in later.chunks] == [2, 3]
    assert [seed for c in later.chunks for seed in c.seeds] == [prompt_seed(trainer.config.trainer.seed, 77, p)
                                                                 for p in range(4, 7)]
    rounds = [(batch, trainer.loop.pipeline.collect(batch, trainer.loop.version)) for batch in (first, later)]
    whole = combine(rounds, trainer.loop.version)
    assert whole.group_refs == [c.scored for c in first.chunks + later.chunks] and whole.versions == [1] * 4
    means = [scored.metrics["reward/mean"] for _, scored in rounds]
    assert whole.metrics["reward/mean"] == pytest.approx((16 * means[0] + 12 * means[1]) / 28)  # by completions
    assert whole.generate_busy_s == pytest.approx(sum(scored.generate_busy_s for _, scored in rounds))


def test_a_chunk_that_keeps_failing_stops_the_run_with_a_clear_error(trainer):
    relabel(trainer, 0, 0)
    trainer.supervisor.max_retries = 0
    try:
        with pytest.raises(ChunkFailed, match=r"rollout worker 0: generate_chunk \(chunk 0 of step 77\): gave up "
                                              r"after 0 retries: sampled by policy version 0, not 1"):
            trainer.loop.pipeline.collect(submit(trainer), trainer.loop.version)
    finally:
        trainer.supervisor.max_retries = trainer.config.cluster.max_restarts + 1
        relabel(trainer, 0, trainer.loop.version)


def driver_memory(run) -> dict[str, int]:
    """What the driver holds while `run` runs, in bytes: the peak and the retained growth of
    its Python heap (tracemalloc; the retained part measured while `run`'s result is still
    referenced), and what Ray keeps in the driver's in-process object store afterwards."""
    core_worker = ray._private.worker.global_worker.core_worker
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    result = run()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    return {"peak": peak - before, "retained": current - before,
            "ray_store": core_worker.get_local_memory_store_bytes_used()}


def test_the_driver_holds_no_groups_when_the_batch_grows_tenfold(trainer):
    """Two steps at 8 and at 80 prompts: the driver's heap and Ray's store in the driver stay flat.

    The baseline, in the same process: fetching a batch of the same size into the driver, as
    the synchronous controller did, grows with the batch.
    """
    loop = trainer.loop
    loop.pipeline.chunk_prompts = 16
    measured = {}
    for prompts in (8, 80):
        trainer.config.rollout.prompts_per_step = prompts
        loop.step(loop.version + 1)  # the batch in flight still has the old size
        measured[prompts] = {
            "steps": driver_memory(lambda: [loop.step(loop.version + 1) for _ in range(2)]),
            "fetched": driver_memory(lambda: loop.rollout(loop.cursor.next_batch(prompts), loop.sampling, 99)),
        }
    print("driver memory, bytes:", measured)
    steps, fetched = ({size: measured[size][kind] for size in (8, 80)} for kind in ("steps", "fetched"))
    batch_bytes = fetched[80]["retained"] - fetched[8]["retained"]  # 72 prompts' groups, held
    assert batch_bytes > 100_000, "the baseline sees the batch grow"
    assert steps[80]["retained"] - steps[8]["retained"] < 0.2 * batch_bytes, "references and floats, not groups"
    assert steps[80]["peak"] - steps[8]["peak"] < 0.2 * batch_bytes
    # Ray inlines the learner's small results into the driver (80 bytes seen after some steps
    # and not others, as the learner's timing has it: a checksum still to compare); a group is kilobytes
    assert max(steps[8]["ray_store"], steps[80]["ray_store"]) < 1000, "no group inlined into the driver's Ray store"


def test_batches_submitted_for_steps_that_will_not_run_are_cancelled(trainer):
    """An early stop (trainer.max_wall_seconds) leaves batches in flight: they are cancelled,
    and the workers serve the next calls (the final evaluation) right after."""
    trainer.loop.fill(trainer.loop.submitted + 3)
    in_flight = [chunk.info for batch in trainer.loop.in_flight for chunk in batch.chunks]
    assert len(trainer.loop.in_flight) >= 3
    trainer.loop.discard_in_flight()
    assert not trainer.loop.in_flight
    assert len(trainer.loop.rollout(trainer.loop.cursor.next_batch(4), trainer.loop.sampling, 99)) == 4
    cancelled = 0
    for ref in in_flight:
        try:
            ray.get(ref, timeout=60)
        except ray.exceptions.TaskCancelledError:
            cancelled += 1
    assert cancelled > 0, "the queued chunks did not run"


def test_a_generate_past_the_timeout_is_a_hung_worker_killed_and_its_chunk_generated_again(trainer):
    """Last in the module: a restarted actor's small results are inlined into the driver's Ray
    store (measured on Ray 2.60, its RAY_max_direct_call_object_size=0 notwithstanding), which the
    driver-memory test above would see."""
    worker = trainer.actors.rollouts[1]
    pid = ray.get(worker.__ray_call__.remote(lambda _: os.getpid()))
    busy = worker.__ray_call__.remote(lambda _: time.sleep(120))  # worker 1 hangs
    hangs, restarts = trainer.loop.counters["rollout/hangs"], trainer.loop.counters["rollout/restarts"]
    timeout_s, trainer.loop.pipeline.timeout_s = trainer.loop.pipeline.timeout_s, 10.0
    try:
        scored = trainer.loop.pipeline.collect(submit(trainer), trainer.loop.version)
    finally:
        trainer.loop.pipeline.timeout_s = timeout_s
    try:  # (no pytest.raises: its traceback would keep `busy`, and its error in the driver's store, alive)
        ray.get(busy, timeout=60)
        killed = False
    except ray.exceptions.RayActorError:
        killed = True
    del busy
    assert killed
    counters = trainer.loop.counters
    assert counters["rollout/hangs"] == hangs + 1 and counters["rollout/restarts"] == restarts + 1
    assert ray.get(worker.__ray_call__.remote(lambda _: os.getpid())) != pid  # killed; Ray started it again
    assert scored.versions == [trainer.loop.version] * len(scored.versions)  # its chunks: sampled by the right weights
    trainer.publisher.verify_through(trainer.loop.version)  # the repair's push: the learner's weights, verified


def test_an_evaluation_during_which_an_engine_hangs_is_evaluated_again_after_its_restart(trainer, tmp_path, capsys):
    """An evaluation waits through Retry too: its late call names no actor, so the actors that do not
    answer are killed (Ray restarts them, counted as a hang), the publisher repairs the rollout
    worker, and the evaluation runs again and ends. (After the driver-memory test: a restart.)"""
    worker = trainer.actors.rollouts[0]
    busy = worker.__ray_call__.remote(lambda _: time.sleep(120))  # worker 0 hangs
    hangs = trainer.loop.counters["rollout/hangs"]
    config = trainer.config.model_copy(deep=True)
    config.trainer.call_timeout_s = 5.0  # (probe: an engine that answers within it is never killed)
    evaluator = Evaluator(config, trainer.loop.cursor.next_batch(2), trainer.actors.rollouts, trainer.actors.rewards,
                          trainer.publisher.retry, trainer.publisher)
    accuracy = evaluator.evaluate(5, MetricsLog(tmp_path, config))
    try:
        ray.get(busy, timeout=60)
        killed = False
    except ray.exceptions.RayActorError:
        killed = True
    del busy
    assert killed and 0.0 <= accuracy <= 1.0
    assert trainer.loop.counters["rollout/hangs"] == hangs + 1
    assert "the actors that hung were restarted; evaluating again" in capsys.readouterr().out
    trainer.publisher.verify_through(trainer.loop.version)  # the repair's push: the learner's weights, verified
    trainer.publisher.verify_all()  # the restarted engine serves the learner's weights, not model.path's


def test_an_export_in_flight_is_the_version_asked_for_whatever_the_learner_does_next(trainer):
    """export_weights hands Ray the learner's own tensors, not a copy: the object store's copy,
    written as the call returns, is the one copy, and the optimizer step after it does not reach it."""
    learner = trainer.actors.learner
    scored = trainer.loop.pipeline.collect(submit(trainer), trainer.loop.version)
    before = ray.get(learner.checksum.remote())
    exported = learner.export_weights.remote()
    ray.get(learner.train_step.remote(*scored.group_refs))  # an optimizer step, queued right behind the export
    assert ray.get(learner.checksum.remote()) != before
    assert state_checksum(ray.get(exported)) == before

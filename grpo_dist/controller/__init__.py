"""The controller: the driver's side of a run, one file per step of it.

    run.py            TrainingRun: the actors started and stopped, evaluations before and after, the summary
    loop.py           StepLoop: fill, step, train (sync is async with max_staleness 0), checkpoints on schedule
    evaluator.py      Evaluator: the held-out accuracy inside a run, evaluated again when an actor is lost
    checkpointing.py  Checkpointer: a step's checkpoint (driver's and learner's share) saved, a resume restored
    actors.py         the actors started in their placement groups, stopped; the learner's calls (LearnerWatch)
    actor_classes.py  the actors' classes as the driver creates them, their modules imported in the actors alone
    placement.py      placement groups per role, and whether a cluster can hold the run at all
    pipeline.py       a step's prompts in chunks, rollout -> reward -> learner, by reference
    batches.py        chunks, batches and scored batches: what the driver holds, and a scored batch's metrics
    dynamic.py        DAPO's dynamic sampling: rounds until a step holds enough informative groups
    publish.py        publishing each policy version to the engines and verifying what they serve
    retry.py          Retry: every wait on a rollout or reward call; failed ones' actors got back
    recovery.py       the Supervisor: actors restarted, hung ones killed, both counted
    checkpoints.py    run checkpoints written atomically, the newest few kept
    resume.py         the checkpoint a resume continues from: found, read back, its config checked
    manifest.py       a checkpoint's COMPLETE manifest: its files' sizes and sha256, its run's id
    signals.py        SIGINT/SIGTERM: finish the step, save, stop
    errors.py         what ends a run, and with which exit code

Data flows one way: the loop drives the pipeline; the pipeline, the evaluator and the publisher
wait through Retry, which gets the failed calls' actors back (through the Supervisor) and returns
the rollout workers that need weights; the caller has the publisher repair them and sends again.
The Supervisor never calls the publisher (tests/test_layout.py). No file here imports a command
line (launch.py, eval.py, report.py).
"""

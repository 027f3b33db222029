"""A property-based sweep of the config door: every field of the pydantic models in config/schema.py and
config/run.py, each given values it must refuse (wrong types, numbers past their bounds, choices
that do not exist), unknown keys at every level, and combinations that cannot run. Each goes
through launch's own `main([... , "--print-config"])`, the command line's config path, and must
come back exit 2 with one line naming the field, never a traceback; a few go through the real
`python -m grpo_dist.launch` to show that it is the same door.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from grpo_dist.config.schema import Config
from grpo_dist.env.config import EnvConfig
from grpo_dist.launch import main
from grpo_dist.config.run import LoraConfig

ROOT = Path(__file__).resolve().parent.parent
# optional sections are null by default; a dotted override creates them, with these to make them valid
SECTIONS = {"env": (EnvConfig, ["env.name=env_helpers:Countdown", "reward.functions=[{name: env_reward}]",
                                "reward.accuracy_from=env_reward"]),
            "learner.lora": (LoraConfig, [])}
# combinations of valid values that cannot run together (each message names the fields)
CONTRADICTIONS = [
    (["algo.ratio_level=sequence", "algo.tis_cap=2"], ["algo.ratio_level", "algo.tis_cap"]),
    (["algo.dynamic_sampling=true"], ["algo.dynamic_sampling_max_rounds"]),
    (["algo.warmup_steps=20", "trainer.steps=10"], ["algo.warmup_steps", "trainer.steps"]),
    (["algo.ref_refresh_every=5"], ["algo.ref_refresh_every", "algo.beta"]),
    (["algo.minibatch_size=5"], ["algo.minibatch_size", "rollout.group_size"]),
    (["learner.sharding=fsdp"], ["learner.sharding", "learner.num_ranks"]),
    (["learner.offload=all"], ["learner.offload", "learner.sharding"]),
    (["trainer.weight_sync=nccl"], ["trainer.weight_sync"]),
    (["reward.accuracy_from=nope"], ["accuracy_from"]),
    (["reward.functions=[{name: exact_answer}, {name: exact_answer}]"], ["reward"]),
    (["rollout.stop=['']"], ["rollout.stop"]),
    (["model.dtype=float16"], ["model.dtype"]),
    (["trainer.overlap_learning=on", "trainer.mode=async"], ["trainer.overlap_learning", "trainer.mode"]),
    ([*SECTIONS["env"][1], "env.step_timeout_s=300", "env.max_turns=1"],
     ["env.step_timeout_s", "env.max_turns", "trainer.call_timeout_s"]),
    ([*SECTIONS["env"][1], "algo.aggregation=constant"], ["algo.aggregation"]),
    ([*SECTIONS["env"][1][:1]], ["env_reward"]),
]


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any, list[Any]]]:
    """(dotted path, annotation, metadata) of every field of `model` and of its sections."""
    fields = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        section = next((arg for arg in typing.get_args(info.annotation) or (info.annotation,)
                        if isinstance(arg, type) and issubclass(arg, BaseModel)), None)
        if section is not None and typing.get_origin(info.annotation) is not list:
            fields += leaf_fields(section, f"{path}.")
        else:
            fields.append((path, info.annotation, info.metadata))
    return fields


def bad_values(annotation: Any, metadata: list[Any]) -> list[Any]:
    """Values a field of this type and these bounds must refuse."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return ["no_such_choice", 3]
    if type(None) in args:  # Optional[X]: None is fine, the rest as for X
        inner = [arg for arg in args if arg is not type(None)]
        return bad_values(inner[0], metadata) if len(inner) == 1 else ["no_such_choice", {"nested": 1}]
    if len(args) > 1 and typing.get_origin(annotation) is typing.Union:  # e.g. list[str] | Literal[...]
        return [3, {"nested": 1}]
    if annotation is bool:
        return ["maybe", [1, 2]]
    if annotation in (int, float):
        values = ["not a number", [1, 2]] + ([1.5] if annotation is int else [])
        for bound in metadata:
            if isinstance(bound, annotated_types.Ge):
                values.append(bound.ge - 1)
            if isinstance(bound, annotated_types.Gt):
                values.append(bound.gt)
            if isinstance(bound, annotated_types.Le):
                values.append(bound.le + 1)
            if isinstance(bound, annotated_types.Lt):
                values.append(bound.lt)
        return values
    if annotation is str:
        return [[1, 2], {"nested": 1}]
    if typing.get_origin(annotation) is dict:
        return ["not a mapping", [1, 2]] + ([{"key": "not a number"}] if typing.get_args(annotation)[1] is float else [])
    return ["not a list", {"nested": 1}]  # lists


def cases() -> list[tuple[list[str], list[str]]]:
    """Every bad value of every field, an unknown key in every section, and the contradictions:
    (overrides, the fields the message must name)."""
    found = []
    for path, annotation, metadata in leaf_fields(Config):
        setup = next((extra for section, (_, extra) in SECTIONS.items() if path.startswith(f"{section}.")), [])
        for value in bad_values(annotation, metadata):
            found.append(([*setup, f"{path}={json.dumps(value)}"], [path]))
    sections = {path.rsplit(".", 1)[0] for path, _, _ in leaf_fields(Config) if "." in path}
    found += [([f"{section}.no_such_field=1"], [f"{section}.no_such_field"]) for section in sorted(sections)]
    found += [(["no_such_section.field=1"], ["no_such_section"]), (["algo=3"], ["algo"])]
    return found + CONTRADICTIONS


CASES = cases()


def refused_in_process(overrides: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """launch.main on the command line `overrides --print-config`: (exit code, stderr)."""
    capsys.readouterr()
    code = main([*overrides, "--print-config"])
    return code, capsys.readouterr().err


def assert_refused(code: int, stderr: str, fields: list[str], overrides: list[str]) -> None:
    assert code == 2, (overrides, code, stderr)
    assert stderr.startswith("error: invalid config: ") and stderr.count("\n") == 1, (overrides, stderr)
    assert "Traceback" not in stderr
    assert all(field in stderr for field in fields), (overrides, fields, stderr)


def test_the_sweep_covers_every_field_and_the_models_accept_their_defaults():
    paths = {path for path, _, _ in leaf_fields(Config)}
    assert {"algo.lr", "rollout.vllm.max_model_len", "learner.lora.alpha", "env.step_timeout_s",
            "trainer.call_timeout_s", "cluster.max_restarts", "reward.functions"} <= paths
    assert len(CASES) > 300, len(CASES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), more=st.lists(st.sampled_from(CASES), max_size=2))
def test_every_bad_value_is_exit_2_in_one_line_naming_the_field(case, more, capsys):
    """A drawn case, alone and with up to two more bad overrides on top: exit 2, one line, the
    first case's fields named."""
    overrides, fields = case
    assert_refused(*refused_in_process(overrides, capsys), fields, overrides)
    combined = [*overrides, *(o for other, _ in more for o in other)]
    code, stderr = refused_in_process(combined, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, (combined, stderr)


PATHS = sorted({path for path, _, _ in leaf_fields(Config)} | {"algo", "no_such_section.field"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=st.text(max_size=24))
def test_any_text_as_any_value_is_taken_or_refused_in_one_line(path, value, capsys):
    """Whatever a user types after `field=` (YAML or not, newlines, brackets, unicode): exit 0
    (printed), or exit 2 in one line; never an exception or a traceback."""
    code, stderr = refused_in_process([f"{path}={value}"], capsys)
    assert code in (0, 2), (path, value, code, stderr)
    assert code == 0 or (stderr.startswith("error: ") and stderr.count("\n") == 1), (path, value, stderr)


def test_every_case_in_process(capsys):
    """The whole catalogue, each case once (the property test above draws from it)."""
    for overrides, fields in CASES:
        assert_refused(*refused_in_process(overrides, capsys), fields, overrides)


@pytest.mark.parametrize("overrides,fields", [
    (["rollout.group_size=1"], ["rollout.group_size"]),
    (["algo.aggregation=\"no_such_choice\""], ["algo.aggregation"]),
    (["trainer.no_such_field=1"], ["trainer.no_such_field"]),
    (CONTRADICTIONS[0][0], CONTRADICTIONS[0][1]),
    ([*SECTIONS["env"][1], "env.step_timeout_s=300", "env.max_turns=1"], ["env.step_timeout_s", "env.max_turns"]),
])
def test_the_real_command_line_is_the_same_door(overrides, fields, tmp_path, capsys):
    """`python -m grpo_dist.launch` without --print-config (a run would start): the same exit code
    and line as in process, and nothing written."""
    result = subprocess.run([sys.executable, "-m", "grpo_dist.launch", *overrides,
                             f"trainer.output_dir={tmp_path / 'runs'}"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"})
    assert_refused(result.returncode, result.stderr, fields, overrides)
    assert (result.returncode, result.stderr) == refused_in_process(
        [*overrides, f"trainer.output_dir={tmp_path / 'runs'}"], capsys)
    assert not (tmp_path / "runs").exists() and "Ray" not in result.stdout + result.stderr

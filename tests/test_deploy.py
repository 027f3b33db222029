"""deploy/: every file parses, and the image and manifests name the versions pyproject.toml does.

Not run here (no Docker engine, no Kubernetes, no SLURM on these machines): building the
image, `ray up`, the RayJob, sbatch. tests/test_jobs.py runs `ray job submit` for real.
"""

import re
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def requirement(name: str) -> Requirement:
    [found] = [Requirement(r) for r in PYPROJECT["dependencies"] if Requirement(r).name == name]
    return found


def build_arg(name: str) -> str:
    return re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M).group(1)


def manifests() -> dict[str, dict]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(DEPLOY.glob("*.yaml"))}


def test_the_yaml_files_parse_and_the_slurm_script_is_valid_bash():
    assert set(manifests()) == {"ray-cluster.yaml", "rayjob.yaml"}
    subprocess.run(["bash", "-n", str(DEPLOY / "slurm.sh")], check=True)
    assert (DEPLOY / "slurm.sh").stat().st_mode & 0o111, "executable"


def test_the_image_installs_the_python_torch_and_ray_of_pyproject():
    python = re.search(r"^FROM python:(\d+\.\d+)", DOCKERFILE, re.M).group(1)
    assert PYPROJECT["requires-python"] == f">={python}"
    assert f"torch=={next(iter(requirement('torch').specifier)).version}" in DOCKERFILE
    ray_version = build_arg("RAY_VERSION")
    assert requirement("ray").specifier.contains(ray_version) and "default" in requirement("ray").extras
    assert build_arg("EXTRAS") in PYPROJECT["optional-dependencies"]


def test_the_manifests_run_that_image_and_that_ray():
    rayjob, launcher = manifests()["rayjob.yaml"], manifests()["ray-cluster.yaml"]
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == build_arg("RAY_VERSION")
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = {c["image"] for g in groups for c in g["template"]["spec"]["containers"]}
    assert images == {launcher["docker"]["image"]}
    entrypoint = rayjob["spec"]["entrypoint"].split()
    assert entrypoint[:3] == ["python", "-m", "grpo_dist.launch"]
    assert (ROOT / entrypoint[entrypoint.index("--config") + 1]).is_file()

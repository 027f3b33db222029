"""How far the default job's first optimizer step is from the least a Ray actor-learner design
can take on this machine: ours against bare floors, alternating, in one invocation.

    .venv/bin/python benchmarks/startup_floor.py [--steps 3] [--repeats 3]
    .venv/bin/python benchmarks/startup_floor.py --job real [--repeats 3]

Each time is seconds from the moment its process is spawned, measured the same way as in
benchmarks/startup.py (ours: step 1's `time/learn_ended`):

- one process's imports: `import torch` and transformers' AutoTokenizer and
  AutoModelForCausalLM, nothing else, to that process's end (its exit included): what a one-process trainer (TRL) pays before it loads
  its model, and what every process of ours that tokenizes or holds a model pays.
- Ray up: a bare driver's `ray.init` of a local cluster, as launch starts it (no dashboard).
- driver and two actors imported: that driver importing what tokenizing needs while Ray
  starts, then two actors (a learner's and an engine's process) importing what holding a model
  needs; done when all three have. Nothing is loaded, evaluated or trained yet: any design
  with the learner and the rollout engine in processes of their own pays at least this before
  its first step.

`--job real` runs the real-model recipe (configs/smollm2_word_problems.yaml on SmolLM2-135M-Instruct,
one step, no evaluation), and its floor's two actors also load the model as the recipe's learner
and engine do: `AutoModelForCausalLM.from_pretrained` in float32, and the engine's model as the
recipe's engine holds it (vLLM's `LLM` built in the process with the recipe's settings, or
`from_pretrained` again for the transformers engine); `--engine` sets the engine of both. Ours is
then reported twice: to the end of its first optimizer step, and to that step's start (the end
less `time/step_s`: 64 completions of up to 48 tokens are compute that no floor holds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import ROOT, one_run, real_job  # noqa: E402

ONE_PROCESS = "import torch; from transformers import AutoModelForCausalLM, AutoTokenizer"

RAY_FLOOR = """
import json, os, sys, threading, time
spawned, MODEL, ENGINE = float(sys.argv[1]), *(sys.argv[2:4] if len(sys.argv) > 2 else ("", ""))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray

def tokenizer_imports():
    import torch
    from transformers import AutoTokenizer

driver = threading.Thread(target=tokenizer_imports)
driver.start()
ray.init(address="local", num_cpus=4, include_dashboard=False)
ray_up = time.time()

@ray.remote(num_cpus=1)
class Bare:
    def __init__(self, load):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        if load == "hf":
            torch.set_num_threads(2)
            self.model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
        elif load == "vllm":
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            torch.set_num_threads(2)
            from vllm import LLM
            self.llm = LLM(MODEL, dtype="float32", max_model_len=512, enforce_eager=True,
                           distributed_executor_backend="uni", kv_cache_memory_bytes=1 << 29)

    def ready(self):
        return time.time()

actors = [Bare.remote(load) for load in (["hf", "vllm" if ENGINE == "vllm" else "hf"] if MODEL else ["none", "none"])]
actors_ready = max(ray.get([actor.ready.remote() for actor in actors]))
driver.join()
floor = "driver_and_two_actors_loaded_s" if MODEL else "driver_and_two_actors_imported_s"
print(json.dumps({"ray_up_s": ray_up - spawned, floor: max(actors_ready, time.time()) - spawned}))
ray.shutdown()
"""


def timed(code: str, *args: str) -> dict[str, float]:
    """Run `code` in a new interpreter, given its spawn time as argv[1] (then `args`); its last JSON
    line is the answer (an actor's log lines may follow it: Ray forwards them until it shuts down),
    else the seconds to its end."""
    spawned = time.time()
    result = subprocess.run([sys.executable, "-c", code, str(spawned), *args], capture_output=True, text=True)
    ended = time.time()
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    answers = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(answers[-1]) if answers else {"one_process_imports_s": ended - spawned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=["default", "real"], default="default")
    parser.add_argument("--steps", type=int, default=None, help="ours' steps (default: 3; the real job 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine", choices=["vllm", "transformers"], default=None,
                        help="the real job's engine, ours and the floor's (default: the recipe's)")
    args = parser.parse_args()
    job, engine, model = real_job(args.engine) if args.job == "real" else ((), "", "")
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            ours = one_run(ROOT, args.steps or (1 if model else 3), Path(tmp) / f"ours-{repeat}", job)
            floor_args = (model, engine) if model else ()
            measured = {**timed(ONE_PROCESS), **timed(RAY_FLOOR, *floor_args), "ours_first_step_s": ours["first_step_s"]}
            if model:
                measured["ours_first_step_start_s"] = ours["first_step_start_s"]
            for key, value in measured.items():
                samples.setdefault(key, []).append(value)
            print(json.dumps({k: round(v, 2) for k, v in measured.items()}), flush=True)
    print_against(samples, "driver_and_two_actors_loaded_s" if model else "driver_and_two_actors_imported_s",
                  f"{args.job} job{f' ({engine} engine)' if engine else ''}, medians over {args.repeats} runs each"
                  " | seconds from spawn | / floor")


def print_against(samples: dict[str, list[float]], base: str, header: str) -> None:
    """The table: each measure's median and its ratio to the median of `base`."""
    medians = {key: statistics.median(values) for key, values in samples.items()}
    print(f"\n{header}\n---|---|---")
    for key, value in medians.items():
        print(f"{key} | {value:.2f} | {value / medians[base]:.2f}")


if __name__ == "__main__":
    main()

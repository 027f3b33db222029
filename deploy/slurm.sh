#!/usr/bin/env bash
# grpo_dist on a SLURM allocation: a Ray head on the first node, a Ray worker on every other
# node, then one training run driven from the first node.
#
#   sbatch deploy/slurm.sh configs/cluster.yaml [section.field=value ...]
#   sbatch --nodes=8 --gpus-per-node=8 deploy/slurm.sh configs/my_7b.yaml trainer.mode=async
#
# Edit the #SBATCH lines (or pass the same options to sbatch) for your partition. Every node
# needs the same environment (`pip install -e .` of the same commit, or the image in
# deploy/Dockerfile through your site's container plugin) and must read the model and data
# paths. Ray's token authentication is on by default: with a shared $HOME every node reads
# the same ~/.ray/auth_token; otherwise export RAY_AUTH_TOKEN before sbatch.
# Environment knobs: RAY_PORT (default 6379), RAY_HEAD_ARGS / RAY_WORKER_ARGS (extra
# `ray start` options, e.g. --resources='{"engine_node": 8}' or --labels=pool=gpu to match
# rollout.resources / rollout.node_labels), NODE_WAIT_S (how long to wait for the nodes).
#SBATCH --job-name=grpo_dist
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --output=grpo_dist-%j.log
set -euo pipefail

config=${1:?usage: sbatch deploy/slurm.sh CONFIG.yaml [section.field=value ...]}
shift
port=${RAY_PORT:-6379}
cpus=${SLURM_CPUS_PER_TASK:-1}
gpus=${SLURM_GPUS_ON_NODE:-0}
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
export RAY_ADDRESS="$head_ip:$port"  # launch joins this cluster (and fails fast if it does not answer)

# Each `ray start --block` runs as a job step until the allocation ends or this script exits.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
# shellcheck disable=SC2086  # RAY_HEAD_ARGS / RAY_WORKER_ARGS are lists of options
srun --nodes=1 --ntasks=1 -w "$head_node" ray start --head --block --node-ip-address="$head_ip" --port="$port" \
    --num-cpus="$cpus" --num-gpus="$gpus" ${RAY_HEAD_ARGS:-} &
until (exec 3<>"/dev/tcp/$head_ip/$port") 2>/dev/null; do sleep 5; done  # the head's GCS listens
for node in "${nodes[@]:1}"; do
    # shellcheck disable=SC2086
    srun --nodes=1 --ntasks=1 -w "$node" ray start --block --address="$RAY_ADDRESS" \
        --num-cpus="$cpus" --num-gpus="$gpus" ${RAY_WORKER_ARGS:-} &
done

python - "${#nodes[@]}" "${NODE_WAIT_S:-600}" <<'EOF'
import sys, time
import ray

want, wait_s = int(sys.argv[1]), float(sys.argv[2])
ray.init(log_to_driver=False)
deadline = time.monotonic() + wait_s
while (alive := sum(node["Alive"] for node in ray.nodes())) < want:
    if time.monotonic() > deadline:
        sys.exit(f"only {alive} of {want} nodes joined the Ray cluster in {wait_s:.0f} s")
    time.sleep(5)
print(f"{alive} nodes: {ray.cluster_resources()}")
EOF

python -m grpo_dist.launch --config "$config" "$@"

#!/usr/bin/env bash
# Build the trainer image and turn it into a squashfs that pyxis (srun --container-image) can start.
#   containers/enroot-import.sh [OUT.sqsh] [BASE_IMAGE]
# Needs docker (or podman as docker) and enroot on the machine that runs it; put OUT.sqsh on a file system
# every compute node sees, then point the campaign at it: container.image: /path/to/OUT.sqsh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-mbx-trainer.sqsh}
base=${2:-nvcr.io/nvidia/pytorch:26.01-py3}
tag=mbx-trainer:$(git rev-parse --short HEAD 2>/dev/null || echo local)

docker build -f containers/Dockerfile --build-arg "BASE_IMAGE=${base}" -t "${tag}" .
rm -f "${out}"
# dockerd:// reads the image from the local Docker daemon (no registry round trip)
enroot import --output "${out}" "dockerd://${tag}"
echo "wrote ${out}: set container.image: $(realpath "${out}") in the campaign"

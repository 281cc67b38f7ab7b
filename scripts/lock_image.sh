#!/usr/bin/env bash
# Writes docker/requirements.lock: every package the container image installs, pinned with
# its hashes, for the image's Python (3.12) on any platform. The image installs exactly these
# (pip --require-hashes), so two builds of one commit get the same packages.
#
# Run it after changing pyproject.toml's dependencies, the extras below or the build backend
# (tests/unit/test_image_lock.py fails until the lock is in step), and to take newer releases.
# Needs uv (pip install uv); UV=/path/to/uv to use another.
set -euo pipefail
cd "$(dirname "$0")/.."
"${UV:-uv}" pip compile pyproject.toml docker/build-requirements.in \
    --extra kafka --extra rabbitmq --extra metrics --extra otel --extra otlp \
    --universal --python-version 3.12 --generate-hashes --quiet \
    --custom-compile-command "scripts/lock_image.sh" \
    --output-file docker/requirements.lock

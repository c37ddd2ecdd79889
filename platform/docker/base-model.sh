#!/usr/bin/env bash
# One-shot: make sure the base model is in the models volume before vLLM and the migrations use it.
# VLLM_MODEL (default /models/starter-small) holding config.json: nothing to do. The default place
# and nothing there: build the small starter model (python -m model_supply starter, a few minutes on
# a CPU) into /models and link /models/starter-small to it. Any other place must hold a model
# already: copy a Hugging Face model directory into the volume first.
set -euo pipefail
starter=/models/starter-small
model=${VLLM_MODEL:-$starter}
if [[ -f "$model/config.json" ]]; then
    echo "base-model: $model is in place"
    exit 0
fi
if [[ "$model" != "$starter" ]]; then
    echo "base-model: VLLM_MODEL=$model holds no config.json; put the base model there first" >&2
    exit 1
fi
built=$(python -m model_supply starter --size small --out /models)
ln -sfn "$(basename "$built")" "$starter"
echo "base-model: $starter -> $built"

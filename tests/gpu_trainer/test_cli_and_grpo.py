"""The command line and the offline GRPO mode, end to end on the tiny starter model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpu_trainer.config import GRPOConfig
from gpu_trainer.grpo import group_advantages, train_grpo
from learning_shared.fim_metrics import edit_similarity
from tests.gpu_trainer.helpers import prompt_ids

REPO = Path(__file__).resolve().parents[2]
FIM_CASES = [
    {"prefix": "def add(a, b):\n    ", "suffix": "\n", "middle": "return a + b"},
    {"prefix": "import os\nimport ", "suffix": "\n", "middle": "sys"},
]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpu_trainer", *args], cwd=REPO, capture_output=True, text=True)


def test_help_works_without_a_model_and_lists_only_training_commands():
    out = _cli("--help")
    assert out.returncode == 0 and "train" in out.stdout and "score" in out.stdout
    assert "starter" not in out.stdout.split("positional arguments")[1]  # base models are model_supply's


def test_cli_trains_an_adapter_then_scores_it(tiny_starter_model, tmp_path):
    prompt = prompt_ids(tiny_starter_model)
    data = tmp_path / "samples.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "prompt_token_ids": prompt,
                    "completion_token_ids": [50 + i],
                    "behaviour_logprobs": None,
                    "reward": 0.75 if i % 2 else -0.25,
                }
            )
            + "\n"
            for i in range(8)
        )
    )
    out = tmp_path / "adapter"
    trained = _cli(
        "train",
        "--data",
        str(data),
        "--base",
        str(tiny_starter_model),
        "--out",
        str(out),
        "--set",
        "epochs=1",
        "--set",
        "num_minibatches=2",
        "--no-progress",
    )
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["steps"] == 2
    again = _cli("train", "--data", str(data), "--base", str(tiny_starter_model), "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr

    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(c) + "\n" for c in FIM_CASES) + data.read_text())
    scored = _cli(
        "score", "--data", str(cases), "--base", str(tiny_starter_model), "--adapter", str(out), "--max-new-tokens", "8"
    )
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout)
    assert result["fim_cases"] == 2 and 0 <= result["edit_similarity"] <= 1
    assert result["samples"] == 8 and result["mean_logprob"] < 0


def test_bad_input_on_the_cli_is_one_line_not_a_traceback(tiny_starter_model, tmp_path):
    data = tmp_path / "samples.jsonl"
    data.write_text('{"prompt_token_ids": [1], "completion_token_ids": [2], "reward": "yes"}\n')
    out = _cli("train", "--data", str(data), "--base", str(tiny_starter_model), "--out", str(tmp_path / "a"))
    assert out.returncode == 2 and "sample 0: reward must be a finite number" in out.stderr
    assert "Traceback" not in out.stderr


def test_grpo_writes_an_adapter_from_sampled_groups(tiny_starter_model, tmp_path):
    config = GRPOConfig(group_size=4, max_new_tokens=6, epochs=1, num_minibatches=2)
    result = train_grpo(config, FIM_CASES, base_model_dir=tiny_starter_model, out_dir=tmp_path / "grpo", progress=False)
    record = json.loads((result.out_dir / "strop_train_config.json").read_text())
    assert record["mode"] == "grpo" and record["config"]["group_size"] == 4
    assert result.steps == 2 and result.summary["samples"] == 8


def test_group_advantages_and_edit_similarity():
    import torch

    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert abs(float(advantages.mean())) < 1e-6 and advantages[0] > 0 > advantages[1]
    assert group_advantages(torch.tensor([0.5, 0.5])).tolist() == [0.0, 0.0]
    assert edit_similarity("return a + b", "return a + b") == 1.0
    assert edit_similarity("", "") == 1.0
    assert abs(edit_similarity("kitten", "sitting") - (1 - 3 / 7)) < 1e-9

"""Bad input is refused with a TrainerInputError that names the sample and the field."""

from __future__ import annotations

import pytest

from gpu_trainer.config import PPOConfig
from gpu_trainer.ppo import train_ppo
from learning_shared.errors import TrainerInputError
from learning_shared.samples import Sample, load_samples
from tests.gpu_trainer.helpers import typed

GOOD = (
    '{"prompt_token_ids": [1, 5, 6], "completion_token_ids": [7, 8], '
    '"behaviour_logprobs": [-1.0, -0.5], "reward": 0.75}'
)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"prompt_token_ids": [1], "completion_token_ids": [7, 8], "behaviour_logprobs": [-1.0], "reward": 1}',
            r"sample 1: behaviour_logprobs has 1 entries but completion_token_ids has 2",
        ),
        (
            '{"prompt_token_ids": [1], "completion_token_ids": [7], "behaviour_logprobs": null, "reward": NaN}',
            r"sample 1: reward must be a finite number",
        ),
        (
            '{"prompt_token_ids": [1], "completion_token_ids": [7], "behaviour_logprobs": [Infinity], "reward": 1}',
            r"sample 1: behaviour_logprobs\[0\]",
        ),
        (
            '{"prompt_token_ids": [1], "completion_token_ids": [7], "behaviour_logprobs": [NaN], "reward": 1}',
            r"sample 1: behaviour_logprobs\[0\]",
        ),
        (
            '{"prompt_token_ids": [1], "completion_token_ids": ["a"], "reward": 1}',
            r"sample 1: completion_token_ids must be a list of integers",
        ),
        ('{"prompt_token_ids": [], "completion_token_ids": [7], "reward": 1}', r"sample 1: prompt_token_ids is empty"),
        ('{"prompt_token_ids": [1], "completion_token_ids": [7]}', r"sample 1: missing field 'reward'"),
        ("{not json", r"sample 1 \(line 2\): invalid JSON"),
    ],
)
def test_bad_sample_lines_name_the_sample_and_field(tmp_path, line, message):
    path = tmp_path / "samples.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(TrainerInputError, match=message):
        load_samples(path)


def test_silence_with_a_logged_eos_logprob_is_accepted(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text(
        '{"prompt_token_ids": [1], "completion_token_ids": [], "behaviour_logprobs": [-0.1], "reward": 0}\n'
    )
    (sample,) = load_samples(path)
    assert sample.completion_token_ids == () and sample.behaviour_logprobs is None


def test_empty_dataset_is_refused(tiny_starter_model, tmp_path):
    with pytest.raises(TrainerInputError, match="dataset is empty"):
        train_ppo(PPOConfig(), [], base_model_dir=tiny_starter_model, out_dir=tmp_path / "out", progress=False)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_starter_model, tmp_path):
    samples = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [5], "behaviour_logprobs": None, "reward": 1.0},
        {"prompt_token_ids": [1, 2], "completion_token_ids": [5, 10**6], "behaviour_logprobs": None, "reward": 0.0},
    ]
    with pytest.raises(TrainerInputError, match=r"sample 1: completion_token_ids\[1\] = 1000000 is outside"):
        train_ppo(PPOConfig(), typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out",
                  progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_config_names_the_field():
    with pytest.raises(TrainerInputError, match="baseline"):
        PPOConfig(baseline="median")
    with pytest.raises(TrainerInputError, match="unknown field"):
        PPOConfig.from_dict({"learning_rat": 1e-3})


@pytest.mark.parametrize(
    ("field", "value"),
    [("target_kl", "None"), ("epochs", "2"), ("epochs", 2.5), ("learning_rate", "1e-3"), ("autocast_bf16", 1)],
)
def test_a_config_value_of_the_wrong_type_names_the_field(field, value):
    """As JSON overrides arrive (``--set target_kl=None`` reads as a string): a clear error, not a
    TypeError from a comparison inside validation."""
    with pytest.raises(TrainerInputError, match=f"{field} has the wrong type"):
        PPOConfig.from_dict({field: value})


def test_a_config_accepts_null_target_kl_and_an_int_learning_rate():
    assert PPOConfig.from_dict({"target_kl": None, "learning_rate": 1}).target_kl is None


def test_silent_samples_name_the_tokens_that_show_nothing():
    from learning_shared.samples import silent_token_ids

    samples = typed([
        {"prompt_token_ids": [1], "completion_token_ids": [198], "reward": 0.0, "silent": True},
        {"prompt_token_ids": [1], "completion_token_ids": [216, 198], "reward": 0.0, "silent": True},  # two tokens
        {"prompt_token_ids": [1], "completion_token_ids": [], "reward": 0.0},  # EOS first: silent
        {"prompt_token_ids": [1], "completion_token_ids": [5, 6], "reward": -0.25},
    ])
    assert [s.silent for s in samples] == [True, True, True, False]
    assert silent_token_ids(samples, eos_id=0) == [0, 198]
    with pytest.raises(TrainerInputError, match="silent must be true or false"):
        Sample.from_dict({"prompt_token_ids": [1], "completion_token_ids": [2], "reward": 0.0, "silent": "yes"}, 0)


def test_the_trainer_takes_typed_samples_and_names_a_dict_at_once(tiny_starter_model, tmp_path):
    """The exporter builds ``Sample`` objects; a dict is a caller that skipped that step, not
    something the trainer parses again."""
    sample = {"prompt_token_ids": [1, 2], "completion_token_ids": [5], "reward": 1.0}
    with pytest.raises(TypeError, match="sample 0 is a dict, not a Sample"):
        train_ppo(PPOConfig(), [sample], base_model_dir=tiny_starter_model, out_dir=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_typed_sample_checks_what_its_types_cannot_say():
    with pytest.raises(TrainerInputError, match="interaction 7: token_rewards has 1 entries"):
        Sample.build(prompt_token_ids=[1], completion_token_ids=[2, 3], reward=0.0, token_rewards=[1.0],
                     where="interaction 7")
    with pytest.raises(TrainerInputError, match="prompt_token_ids is empty"):
        Sample.build(prompt_token_ids=[], completion_token_ids=[2], reward=0.0)

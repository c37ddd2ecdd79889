"""Continue against Strop, configured by the config.yaml block of docs/editors.md.

The requests below are built as Continue's source builds them (read in continuedev/continue:
core/llm/llms/OpenAI.ts ``_legacystreamComplete`` and ``_getHeaders``, core/autocomplete/templating
for the default StarCoder-style template and its stop list, packages/fetch for how
``requestOptions.headers`` are merged, core/data/log.ts ``logToOneDestination`` for the outcome
envelope), and the stream is read as its ``streamSse`` reads it.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from apps.cohorts.models import EndUser
from apps.interactions.models import Feedback, Interaction

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

EDITORS_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "editors.md"
# Continue's default template for a model name it does not know, and its stop strings.
TEMPLATE_STOPS = [
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
    "<file_sep>",
    "<|endoftext|>",
    "</fim_middle>",
    "</code>",
]
COMMON_STOPS = ["/src/", "#- coding: utf-8", "```"]
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"


def readme_config(base_url: str, key: str) -> dict:
    section = EDITORS_GUIDE.read_text().split("## Editor plugins (Continue)", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    text = block.replace("http://127.0.0.1:8000", base_url).replace(
        "strop_XXXXXXXXXXXX_editor-key", key
    )
    return yaml.safe_load(text)


def continue_completion(config: dict) -> str:
    """One autocomplete request as Continue sends it, the stream read as Continue reads it."""
    model = config["models"][0]
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {model['apiKey']}",
        "api-key": model["apiKey"],
        **config["requestOptions"]["headers"],
    }
    body = {
        "model": model["model"],
        "max_tokens": 4096,
        "temperature": 0.01,
        "stream": True,
        "stop": TEMPLATE_STOPS + COMMON_STOPS,
        "prompt": f"<fim_prefix># Path: calc.py\n{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>",
    }
    text = ""
    with httpx.stream("POST", model["apiBase"] + "completions", json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                value = json.loads(line[5:])
                assert not value.get("error"), value
                choices = value.get("choices") or []
                if choices and choices[0].get("text"):
                    text += choices[0]["text"]
    return body["prompt"], text


def post_outcome(config: dict, data: dict, *, level: str = "all", name: str = "autocomplete") -> httpx.Response:
    destination = config["data"][0]
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {destination['apiKey']}",
        **config["requestOptions"]["headers"],
    }
    envelope = {"name": name, "data": data, "schema": destination["schema"], "level": level, "profileId": "local"}
    return httpx.post(destination["destination"], json=envelope, headers=headers, timeout=60)


def outcome_data(prompt: str, completion: str, *, accepted: bool, no_code: bool = False) -> dict:
    data = {
        "eventName": "autocomplete",
        "schema": "0.2.0",
        "timestamp": "2026-11-23T10:00:00.000Z",
        "userId": "",
        "userAgent": "Visual Studio Code/1.101.0 (Continue/1.3.40)",
        "selectedProfileId": "local",
        "disable": False,
        "maxPromptTokens": 1024,
        "debounceDelay": 350,
        "maxSuffixPercentage": 0.2,
        "prefixPercentage": 0.3,
        "transform": True,
        "multilineCompletions": "auto",
        "slidingWindowPrefixPercentage": 0.75,
        "slidingWindowSize": 500,
        "useCache": True,
        "onlyMyCode": True,
        "useRecentlyEdited": True,
        "useImports": True,
        "accepted": accepted,
        "time": 612,
        "modelProvider": "openai",
        "modelName": "tab",
        "cacheHit": False,
        "filepath": "file:///home/u/calc.py",
        "completionId": str(uuid.uuid4()),
        "uniqueId": "machine-1",
    }
    if not no_code:
        data.update(prefix=f"# Path: calc.py\n{PREFIX}", suffix=SUFFIX, prompt=prompt, completion=completion)
    return data


@pytest.fixture
def continue_config(live_server, serving_tenant, serving_adapter):
    serving_adapter.name = "tab"
    serving_adapter.save(update_fields=["name"])
    from apps.tenants.services import api_key_create

    # The editor key the guide asks for; the developer consents by the key's default.
    issued = api_key_create(serving_tenant, name="continue", scopes=["editor"], default_opt_in=True)
    return readme_config(live_server.url, issued.raw_key)


def test_an_accepted_suggestion_lands_on_the_tokens_strop_served(continue_config):
    prompt, text = continue_completion(continue_config)
    served = Interaction.objects.get(source="served")
    assert served.prompt == prompt and served.completion == text
    assert served.metadata["fim_convention"] == "starcoder" and served.metadata["max_tokens_requested"] == 4096
    assert served.end_user_id == "alice@example.com" and served.end_user_opted_in is True
    shown = text.strip().split("\n")[0] or text  # Continue may show less than it got
    data = outcome_data(prompt, shown, accepted=True)
    response = post_outcome(continue_config, data)
    assert response.status_code == 200, response.text
    assert response.json()["linked_to_served"] is True
    served.refresh_from_db()
    assert served.client_id == data["completionId"]
    assert Feedback.objects.get(interaction=served).outcome == "accepted"
    assert Interaction.objects.count() == 1  # no second interaction for the outcome
    replay = post_outcome(continue_config, data)  # Continue may log twice: idempotent
    assert replay.status_code == 200 and Interaction.objects.count() == 1
    assert EndUser.objects.get(external_id="alice@example.com").opted_in is True
    from apps.training.selectors import training_events_eligible

    assert training_events_eligible(served.adapter, parent=None).filter(interaction=served).exists()


def test_a_no_code_outcome_is_kept_without_text_and_other_events_are_acknowledged(continue_config):
    prompt, text = continue_completion(continue_config)
    response = post_outcome(continue_config, outcome_data(prompt, text, accepted=False, no_code=True), level="noCode")
    assert response.status_code == 201, response.text
    outcome = Interaction.objects.get(source="editor")
    assert outcome.completion == "" and outcome.metadata["text_withheld"] is True
    assert Feedback.objects.get(interaction=outcome).outcome == "rejected"
    from apps.adapters.models import Adapter
    from apps.training.selectors import training_events_eligible

    eligible = training_events_eligible(Adapter.objects.get(name="tab"), parent=None)
    assert not eligible.filter(interaction=outcome).exists()  # nothing in it to learn from
    ignored = post_outcome(continue_config, {"model": "tab", "promptTokens": 10}, name="tokensGenerated")
    assert ignored.status_code == 202 and ignored.json()["status"] == "ignored"

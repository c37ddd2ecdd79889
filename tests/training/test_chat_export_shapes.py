"""A logged agent turn in any shape OpenAI's chat API takes is exported: text parts, a null content
beside tool calls, on a base whose own template reads content as one string (SmolLM2's); the
reply's own tool calls are learned as what the model wrote, never as silence; and an event no
template can render is left out of the samples, never the cause of a failed window."""

from __future__ import annotations

import pytest

from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.models import Interaction
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.dataset import dataset_export
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunEvent
from learning_shared.chat import chat_completion_text, chat_prompt_text

pytestmark = pytest.mark.django_db

EDIT = {"id": "call-1", "type": "function", "function": {"name": "edit_file", "arguments": '{"path": "utils.py"}'}}
HISTORY = [
    {"role": "system", "content": [{"type": "text", "text": "You edit code."}]},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Rename x to count"}, {"type": "text", "text": "in utils.py"}],
    },
    {"role": "assistant", "content": None, "tool_calls": [EDIT]},
    {"role": "tool", "tool_call_id": "call-1", "content": [{"type": "text", "text": "edited"}]},
]


def _tokenizer(adapter):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(adapter.base_model.path)


def _export(adapter) -> tuple[TrainingRun, object]:
    policy = TrainingPolicy.objects.get(adapter=adapter)
    policy.heldout_fraction = 0.0
    policy.save()
    run = TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter, status="exporting")
    return run, dataset_export(run, policy=policy)


def _log(tenant, client_id: str, *, outcome: str = "thumbs_up", **turn) -> str:
    item = {"client_id": client_id, "end_user_id": "dev-1", "opted_in": True, "conversation_id": "s-1", **turn}
    (result,) = interactions_ingest(tenant, items=[item])
    assert result.status == "created", result.error
    feedback_ingest(tenant, items=[{"client_id": client_id, "outcome": outcome}])
    return str(result.id)


@pytest.fixture
def smollm2_adapter(tenant, smollm2_model):
    base = base_model_register(name="smollm2", path=smollm2_model)
    adapter = adapter_create(tenant, name="agent", base_model=base, is_default=True)
    TrainingPolicy.objects.create(tenant=tenant, adapter=adapter, min_new_events=1)
    return adapter


def test_text_parts_and_a_null_content_beside_tool_calls_export_on_a_string_template(tenant, smollm2_adapter):
    interaction_id = _log(tenant, "t-1", messages=HISTORY, completion="Renamed 4 uses.", turn=1)
    _, window = _export(smollm2_adapter)
    assert not window.left_out
    (sample,) = window.train
    prompt = _tokenizer(smollm2_adapter).decode(list(sample.prompt_token_ids))
    # Parts joined by newlines (vLLM's way for a template that reads content as a string), the null
    # content empty: the conversation is there, nothing raised.
    assert "<|im_start|>user\nRename x to count\nin utils.py<|im_end|>" in prompt
    assert "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\nedited<|im_end|>" in prompt
    assert sample.id == interaction_id and sample.reward == 1.0


def test_a_logged_reply_with_tool_calls_is_learned_as_its_calls_not_as_silence(tenant, tiny_adapter):
    messages = [{"role": "user", "content": "Rename x to count in utils.py"}]
    _log(tenant, "t-2", messages=messages, completion="", tool_calls=[EDIT], turn=0)
    stored = Interaction.objects.get(client_id="t-2")
    assert stored.metadata["tool_calls"] == [EDIT]  # where a served turn keeps them
    _, window = _export(tiny_adapter)
    (sample,) = window.train
    assert not sample.silent and sample.reward == 1.0
    written = _tokenizer(tiny_adapter).decode(list(sample.completion_token_ids))
    assert written == '\n<tool_call>\n{"name": "edit_file", "arguments": {"path": "utils.py"}}\n</tool_call>'


def test_the_calls_are_written_as_the_chat_template_writes_an_assistants_calls(tiny_adapter):
    tokenizer, path = _tokenizer(tiny_adapter), tiny_adapter.base_model.path
    before = [{"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "On it.", "tool_calls": [EDIT, {**EDIT, "id": "call-2"}]}
    rendered = chat_prompt_text(tokenizer, path, [*before, reply, {"role": "user", "content": "thanks"}])
    assert f"<|im_start|>assistant\n{chat_completion_text('On it.', reply['tool_calls'])}<|im_end|>" in rendered


def test_an_event_whose_rendering_raises_anything_is_left_out_and_the_window_goes_on(tenant, tiny_adapter, monkeypatch):
    import apps.training.dataset as dataset

    kept = _log(tenant, "t-3", messages=[{"role": "user", "content": "fine"}], completion="ok", turn=0)
    broken = _log(tenant, "t-4", messages=[{"role": "user", "content": "boom"}], completion="ok", turn=1)
    render = dataset.chat_prompt_ids

    def failing(tokenizer, model_dir, messages, tools=None):  # a template that cannot take this event
        if messages[0]["content"] == "boom":
            raise TypeError('can only concatenate str (not "list") to str')
        return render(tokenizer, model_dir, messages, tools)

    monkeypatch.setattr(dataset, "chat_prompt_ids", failing)
    run, window = _export(tiny_adapter)
    assert [s.id for s in window.train] == [kept]
    (why,) = window.left_out
    assert why.startswith(f"interaction {broken}: ") and "TypeError" in why
    assert TrainingRunEvent.objects.get(run=run, feedback__interaction_id=broken).held_out  # looked at, not new

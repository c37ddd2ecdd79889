"""The shared field checks of ingest items: an empty prompt id list is refused, naming the field."""

from __future__ import annotations

import pytest

from apps.common.item_checks import ItemError, item_token_ids
from apps.interactions.models import Interaction


def test_an_empty_prompt_id_list_is_refused_with_what_to_send_instead():
    with pytest.raises(ItemError) as caught:
        item_token_ids({"prompt_token_ids": []}, "prompt_token_ids")
    assert caught.value.field == "prompt_token_ids"
    assert caught.value.message.startswith("prompt_token_ids: is empty")
    assert "leave the field out" in caught.value.message


def test_an_empty_completion_id_list_is_the_silent_action_and_is_taken():
    assert item_token_ids({"completion_token_ids": []}, "completion_token_ids") == []


@pytest.mark.django_db
def test_an_interaction_with_an_empty_prompt_id_list_is_400_naming_the_field_and_stores_nothing(client_a):
    body = {"client_id": "x", "prompt": "p", "completion": "c", "prompt_token_ids": []}
    response = client_a.post("/v1/interactions", body, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["message"].startswith("prompt_token_ids: is empty"), error
    assert Interaction.objects.count() == 0


@pytest.mark.django_db
def test_an_interaction_that_stayed_silent_with_no_completion_ids_is_still_taken(client_a):
    body = {"client_id": "x", "prompt": "p", "completion": "", "prompt_token_ids": [5], "completion_token_ids": []}
    response = client_a.post("/v1/interactions", body, format="json")
    assert response.status_code == 201, response.json()
    assert Interaction.objects.get().completion_token_ids == []

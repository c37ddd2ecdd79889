"""StrictSerializer's fields: copies of unbound templates (flat ones shallow), each instance's its own,
validating and failing as DRF's deep-copied fields do."""

from __future__ import annotations

import threading

from rest_framework import serializers

from apps.common.parsing import StrictSerializer
from apps.serving.schemas import CompletionIn


class _Inner(StrictSerializer):
    flag = serializers.BooleanField(required=False, default=False)


class _Outer(StrictSerializer):
    name = serializers.CharField(max_length=5)
    count = serializers.IntegerField(min_value=1, max_value=3, default=1)
    ratio = serializers.FloatField(required=False, min_value=0.0, max_value=1.0)
    tags = serializers.ListField(child=serializers.CharField(max_length=3), required=False)
    inner = _Inner(required=False)
    kind = serializers.ChoiceField(choices=["a", "b"], required=False)


def _deep(serializer: serializers.Serializer) -> serializers.Serializer:
    """The same serializer with DRF's own fields (a deep copy of each declared field)."""
    plain = type("Plain", (serializers.Serializer,), {})()
    plain.fields.update(serializers.Serializer.get_fields(serializer))
    return plain


def test_each_instance_has_its_own_bound_fields():
    first, second = _Outer(), _Outer()
    for name in first.fields:
        a, b = first.fields[name], second.fields[name]
        assert a is not b
        assert a.parent is first and b.parent is second and a.field_name == name
    assert first.fields["tags"].child is not second.fields["tags"].child  # a child field: copied deeply
    assert first.fields["inner"].fields["flag"] is not second.fields["inner"].fields["flag"]
    first.fields["name"].required = False  # changing one instance's field leaves the others as declared
    first.fields["kind"].choices = ["z"]
    assert _Outer().fields["name"].required is True
    assert list(_Outer().fields["kind"].choices) == ["a", "b"]


def test_validation_and_its_errors_are_drf_s():
    cases = [
        {"name": "ok", "count": 2, "ratio": 0.5, "tags": ["x"], "inner": {"flag": True}, "kind": "a"},
        {"name": "toolong", "count": 9, "ratio": 2.0, "tags": ["long"], "inner": {"flag": "no?"}, "kind": "c"},
        {"count": 0},
        {"name": "ok", "inner": {"other": 1}},
        {"name": "ok", "unknown": 1},
    ]
    for data in cases:
        ours = _Outer(data=data)
        valid = ours.is_valid()
        if "unknown" in data:  # StrictSerializer's own refusal
            assert not valid and "unknown" in ours.errors
            continue
        drf = _deep(_Outer())
        drf.initial_data = data
        assert valid == drf.is_valid(), data
        if valid:
            assert ours.validated_data == drf.validated_data
        else:
            assert ours.errors == drf.errors, data


def test_the_completion_request_validates_the_same_from_many_threads():
    good = {"prompt": "def f(", "max_tokens": 8, "temperature": 0.2, "stop": ["\n"], "user": "dev-1"}
    bad = {"prompt": "x", "temperature": 9, "n": 0}
    failures: list[str] = []

    def work() -> None:
        for _ in range(200):
            ok = CompletionIn(data=good)
            if not ok.is_valid() or ok.validated_data["max_tokens"] != 8:
                failures.append(f"good: {ok.errors}")
            no = CompletionIn(data=bad)
            if no.is_valid() or set(no.errors) != {"temperature", "n"}:
                failures.append(f"bad: {dict(no.errors)}")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_field_with_a_mutable_default_is_rebuilt_for_each_instance():
    class WithList(StrictSerializer):
        items = serializers.JSONField(default=[])  # noqa: RUF012  # the case under test
        made = serializers.JSONField(default=list)

    first, second = WithList(data={}), WithList(data={})
    assert first.is_valid() and second.is_valid()
    first.validated_data["items"].append(1)
    assert second.validated_data["items"] == [] and WithList().fields["items"].default == []

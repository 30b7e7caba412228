"""``numa_pin.base.record`` behaves as :mod:`dataclasses` does, checked against dataclasses itself.

Hypothesis builds random classes (field kinds, flags, a base class) twice, once with
``dataclasses.dataclass`` and once with ``record``, and then drives both the same way:
construction (valid and invalid), repr, equality, hashing, ordering, frozenness, ``replace``,
``fields``, ``asdict``, class attributes and ``__match_args__``. Any difference fails.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import ClassVar  # noqa: F401  (dataclasses resolves "ClassVar[int]" in this module)

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_pin.base import record as rec

#: field kinds: how a field is declared (the same way in both worlds)
KINDS = ("plain", "default", "factory", "no-compare", "no-repr", "no-hash", "hash-only",
         "no-init", "no-init-factory", "mutable-default", "classvar")


def declare(kind: str, field_fn, value: int):
    """The class-body value for a field of ``kind`` (``field_fn``: dataclasses.field or rec.field)."""
    return {
        "plain": dataclasses.MISSING,
        "default": value,
        "factory": field_fn(default_factory=lambda: [value]),
        "no-compare": field_fn(default=value, compare=False),
        "no-repr": field_fn(default=value, repr=False),
        "no-hash": field_fn(default=value, hash=False),
        "hash-only": field_fn(default=value, compare=False, hash=True),
        "no-init": field_fn(default=value, init=False),
        "no-init-factory": field_fn(default_factory=lambda: (value,), init=False),
        "mutable-default": [value],
        "classvar": value,
    }[kind]


def build(decorate, field_fn, specs, flags, base_specs=()):
    """A class named ``C`` (and its base ``B`` when ``base_specs``) made with ``decorate``;
    returns the class or the exception class creation raised."""

    def make(name, specs, bases):
        annotations, body = {}, {}
        for fname, kind, value in specs:
            annotations[fname] = "ClassVar[int]" if kind == "classvar" else "int"
            declared = declare(kind, field_fn, value)
            if declared is not dataclasses.MISSING:
                body[fname] = declared
        body["__annotations__"] = annotations
        body["__qualname__"] = name
        return decorate(**flags)(type(name, bases, body))

    try:
        bases = (make("B", base_specs, ()),) if base_specs else ()
        return make("C", specs, bases)
    except (TypeError, ValueError) as exc:
        return type(exc)


field_specs = st.lists(
    st.tuples(st.sampled_from("abcdefg"), st.sampled_from(KINDS), st.integers(-3, 3)),
    max_size=5, unique_by=lambda spec: spec[0],
)
flag_sets = st.fixed_dictionaries({"frozen": st.booleans(), "eq": st.booleans(), "order": st.booleans()})


def observe(cls, args, kwargs, other_args):
    """Everything a caller could see of ``cls`` and two of its instances, as plain data."""
    seen: dict[str, object] = {
        "fields": [f.name for f in (dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else rec.fields(cls))],
        "match_args": getattr(cls, "__match_args__", None),
        "hashable": cls.__hash__ is not None,
        "class_attrs": {n: getattr(cls, n, "<absent>") for n in "abcdefg"},
    }
    try:
        one = cls(*args, **kwargs)
    except TypeError:
        seen["construct"] = "TypeError"
        return seen
    two = None
    try:
        two = cls(*other_args)
    except TypeError:
        pass
    seen["repr"] = repr(one)
    seen["state"] = dict(vars(one))
    seen["eq_copy"] = one == copy.deepcopy(one)
    if two is not None:
        seen["eq"] = one == two
        seen["ne"] = one != two
        if cls.__hash__ is not None and one == two:
            try:
                seen["hash_agrees"] = hash(one) == hash(two)
            except TypeError:  # a list field
                seen["hash_agrees"] = "TypeError"
        for op in ("__lt__", "__le__", "__gt__", "__ge__"):
            try:
                seen[op] = getattr(one, op)(two)
            except TypeError:
                seen[op] = "TypeError"
    try:
        one.a = 99
        seen["set"] = ("ok", vars(one).get("a"))
    except AttributeError as exc:
        seen["set"] = type(exc).__name__.replace("FrozenInstanceError", "Frozen")
    asdict = dataclasses.asdict if dataclasses.is_dataclass(one) else rec.asdict
    replace = dataclasses.replace if dataclasses.is_dataclass(one) else rec.replace
    seen["asdict"] = asdict(one)
    try:
        first = seen["fields"][:1]  # type: ignore[index]
        seen["replace"] = vars(replace(one, **{n: 5 for n in first}))
    except (TypeError, ValueError, AttributeError) as exc:
        seen["replace"] = type(exc).__name__.replace("FrozenInstanceError", "Frozen")
    return seen


def record_decorator(**flags):
    return rec.record(**flags)


def dataclass_decorator(**flags):
    if flags["order"] and not flags["eq"]:
        flags = dict(flags, order=False)  # the same refusal, raised below for both
    return dataclasses.dataclass(**flags)


@settings(max_examples=int(os.environ.get('RECORD_EXAMPLES', '600')))
@given(
    specs=field_specs, base_specs=field_specs, flags=flag_sets,
    args=st.lists(st.integers(-2, 2), max_size=6), other_args=st.lists(st.integers(-2, 2), max_size=6),
    kwargs=st.dictionaries(st.sampled_from("abcdefgz"), st.integers(-2, 2), max_size=3),
)
def test_records_behave_as_dataclasses(specs, base_specs, flags, args, kwargs, other_args):
    if flags["order"] and not flags["eq"]:
        return  # dataclasses refuses order without eq; record never sees that combination
    base_classvars = {name for name, kind, _ in base_specs if kind == "classvar"}
    if any(name in base_classvars for name, _, _ in specs):
        return  # turning a base's ClassVar into a field: dataclasses keeps the ClassVar's place
    expected = build(dataclass_decorator, dataclasses.field, specs, flags, base_specs)
    got = build(record_decorator, rec.field, specs, flags, base_specs)
    if isinstance(expected, type) and issubclass(expected, Exception):
        assert got is expected
        return
    assert not (isinstance(got, type) and issubclass(got, Exception)), got
    assert observe(got, args, kwargs, other_args) == observe(expected, args, kwargs, other_args)


def test_assigning_to_a_frozen_record_raises_frozen_instance_error():
    @rec.record
    class Point:
        x: int
        y: int = 0

    point = Point(1)
    with pytest.raises(rec.FrozenInstanceError, match="cannot assign to field 'x'"):
        point.x = 2
    with pytest.raises(AttributeError):
        del point.y
    assert point == Point(1, 0) and hash(point) == hash(Point(1, 0))
    assert rec.replace(point, y=3) == Point(1, 3)


def test_a_class_own_methods_are_kept():
    @rec.record
    class Named:
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __hash__(self) -> int:
            return 7

    assert repr(Named("x")) == "<x>" and hash(Named("x")) == 7


def test_post_init_runs_after_the_fields_are_set_and_on_replace():
    calls = []

    @rec.record
    class Checked:
        value: int

        def __post_init__(self) -> None:
            calls.append(self.value)
            if self.value < 0:
                raise ValueError("negative")

    rec.replace(Checked(1), value=2)
    assert calls == [1, 2]
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


def test_slots_and_ordering_overrides_are_refused():
    with pytest.raises(TypeError, match="__slots__"):
        @rec.record
        class Slotted:
            __slots__ = ("x",)
            x: int

    with pytest.raises(TypeError, match="__lt__"):
        @rec.record(order=True)
        class Ordered:
            x: int

            def __lt__(self, other: object) -> bool:
                return True


def test_the_product_does_not_use_dataclasses():
    """Every value class in ``src/numa_pin`` is a record (the hook imports no dataclasses)."""
    import ast
    from pathlib import Path

    import numa_pin

    offenders = []
    for path in sorted(Path(numa_pin.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if "dataclasses" in names:
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders

"""Immutable value classes: :func:`record` is :func:`dataclasses.dataclass` without code generation.

Every value numa-pin passes around (topology, requests, hints' inputs, grants, config) is a
frozen record. The standard library's ``dataclass`` writes each class's ``__init__``,
``__repr__``, ``__eq__``, ``__hash__`` and ``__setattr__`` as source text and compiles it with
``exec`` when the class is created, and its import pulls in :mod:`inspect` (``ast``, ``dis``,
``tokenize``). The hook is a fresh process on every container start, and on its in-process path
that was more than half of its own time: about 8 ms of imports plus 0.4 ms for each of the ~47
classes it creates (``bench/hook_latency.py``). :func:`record` builds the same methods from
closures over precomputed field tuples, so creating a class costs microseconds and nothing
beyond :mod:`operator` is imported.

The behaviour is the standard library's for the subset numa-pin uses, and
``tests/test_record.py`` checks it against :mod:`dataclasses` itself:

* ``@record`` (frozen, the default) or ``@record(frozen=False)``, ``order=True`` and ``eq=False``;
* fields from the class annotations (``ClassVar`` skipped), inherited from record bases;
* :func:`field` with ``default``, ``default_factory``, ``init``, ``repr``, ``compare`` and
  ``hash``; a mutable default (a list, dict or set) is refused, as is a field without a default
  after one with;
* ``__post_init__`` runs after the fields are set; a method the class defines itself is kept;
* equality and ordering compare the field tuple of two instances of the same class only;
  frozen records hash it (a class with ``eq`` and no ``frozen`` is unhashable);
* :func:`replace`, :func:`fields` and :func:`asdict` (recursive through records, lists, tuples
  and dicts), and assigning to a frozen record raises :class:`FrozenInstanceError`.

Not supported (and not used): ``__slots__``, ``InitVar``, ``KW_ONLY``, ``unsafe_hash``.
Type checkers see :func:`record` as a dataclass transform (PEP 681).
"""

from __future__ import annotations

import operator
from operator import attrgetter

TYPE_CHECKING = False  # typing's TYPE_CHECKING without importing typing (the hook does not need it)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform, overload

    _T = TypeVar("_T")
    _R = TypeVar("_R")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: "no default" (a field without ``default`` or ``default_factory``)
MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assigning to (or deleting) a field of a frozen record."""


class Field:
    """One field of a record, as :func:`fields` lists them."""

    __slots__ = ("name", "default", "default_factory", "init", "repr", "compare", "hash")

    def __init__(self, default: Any, default_factory: Any, init: bool, repr: bool, compare: bool,
                 hash: bool | None) -> None:
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare
        self.hash = hash

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, init={self.init})"


if TYPE_CHECKING:
    @overload
    def field(*, default: _T, init: bool = ..., repr: bool = ..., compare: bool = ...,
              hash: bool | None = ...) -> _T: ...

    @overload
    def field(*, default_factory: Callable[[], _T], init: bool = ..., repr: bool = ...,
              compare: bool = ..., hash: bool | None = ...) -> _T: ...

    @overload
    def field(*, init: bool = ..., repr: bool = ..., compare: bool = ...,
              hash: bool | None = ...) -> Any: ...


def field(*, default: Any = MISSING, default_factory: Any = MISSING, init: bool = True,
          repr: bool = True, compare: bool = True, hash: bool | None = None) -> Any:
    """A field with a default, a default factory or other than the usual flags."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, compare, hash)


def fields(obj: object) -> tuple[Field, ...]:
    """The fields of a record class or instance, in definition order."""
    try:
        return tuple(obj.__record_fields__.values())  # type: ignore[attr-defined]
    except AttributeError:
        raise TypeError(f"{obj!r} is not a record") from None


def replace(obj: _R, /, **changes: Any) -> _R:
    """A copy of ``obj`` with ``changes`` (like :func:`dataclasses.replace`; ``__post_init__``
    runs again)."""
    for f in fields(obj):
        if f.init:
            if f.name not in changes:
                changes[f.name] = getattr(obj, f.name)
        elif f.name in changes:
            raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with replace()")
    return obj.__class__(**changes)


def is_record(obj: object) -> bool:
    """Whether ``obj`` is a record class or an instance of one."""
    return hasattr(obj, "__record_fields__")


def asdict(obj: object) -> dict[str, Any]:
    """The fields of a record as a dict, records, lists, tuples and dicts inside copied too."""
    if not is_record(obj) or isinstance(obj, type):
        raise TypeError("asdict() should be called on record instances")
    return {f.name: _copy_out(getattr(obj, f.name)) for f in fields(obj)}


def _copy_out(value: Any) -> Any:
    if is_record(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*[_copy_out(v) for v in value])
    if isinstance(value, list | tuple):
        return type(value)(_copy_out(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_copy_out(k), _copy_out(v)) for k, v in value.items())
    return value


if TYPE_CHECKING:
    @overload
    def record(cls: type[_T], /) -> type[_T]: ...

    @overload
    def record(*, frozen: bool = ..., eq: bool = ..., order: bool = ...) -> Callable[[type[_T]], type[_T]]: ...

    @dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
    def record(cls: type[_T] | None = None, /, *, frozen: bool = True, eq: bool = True,
               order: bool = False) -> Any: ...
else:
    def record(cls=None, /, *, frozen=True, eq=True, order=False):
        """Make ``cls`` a record: ``__init__``, ``__repr__``, ``__eq__`` (``eq``), ``__hash__``
        and a refusing ``__setattr__`` (``frozen``, the default), and ``<``, ``<=``, ``>``,
        ``>=`` (``order``), each only where the class does not define it."""

        def wrap(cls):
            return _make_record(cls, frozen, eq, order)

        return wrap if cls is None else wrap(cls)


def _is_classvar(annotation: object) -> bool:
    """Whether an annotation (a string: every module here has postponed annotations) is a
    ``ClassVar``, which makes a class attribute, not a field."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _own_fields(cls: type) -> dict[str, Field | None]:
    """The fields ``cls`` declares (not inherited), with defaults checked and class attributes set
    as :mod:`dataclasses` leaves them (the default, or nothing); a ``ClassVar`` maps to None."""
    found: dict[str, Field | None] = {}
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            found[name] = None  # not a field, and no longer one if a base declared it
            continue
        value = getattr(cls, name, MISSING)  # an inherited class attribute is a default too
        if isinstance(value, Field):
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(value, MISSING, True, True, True, None)
        f.name = name
        if f.default is not MISSING and f.default.__class__.__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
        found[name] = f
    return found


def _values(names: tuple[str, ...]) -> Callable[[object], tuple[Any, ...]]:
    """A function returning ``(obj.<name>, ...)`` for ``names``, as one tuple."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _make_record(cls: Any, frozen: bool, eq: bool, order: bool) -> type:
    if "__slots__" in cls.__dict__:
        raise TypeError(f"record {cls.__qualname__} cannot define __slots__")
    all_fields: dict[str, Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        inherited = base.__dict__.get("__record_fields__")
        if inherited:
            all_fields.update(inherited)
    for name, own in _own_fields(cls).items():
        if own is None:
            all_fields.pop(name, None)
        else:
            all_fields[name] = own
    cls.__record_fields__ = all_fields
    listed = tuple(all_fields.values())
    init_fields = tuple(f for f in listed if f.init)
    seen_default = False
    for f in init_fields:
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if seen_default and not has_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        seen_default = seen_default or has_default

    def put(name: str, value: object) -> None:
        if name not in cls.__dict__:
            setattr(cls, name, value)

    put("__init__", _init(cls, init_fields, tuple(f for f in listed if not f.init)))
    put("__repr__", _repr(tuple(f.name for f in listed if f.repr)))
    compared = _values(tuple(f.name for f in listed if f.compare))
    if eq:
        put("__eq__", _comparison(compared, operator.eq))
    if order:
        for name, op in (("__lt__", operator.lt), ("__le__", operator.le), ("__gt__", operator.gt),
                         ("__ge__", operator.ge)):
            if name in cls.__dict__:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
            setattr(cls, name, _comparison(compared, op))
    if frozen:
        for name in ("__setattr__", "__delattr__"):
            if name in cls.__dict__:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
        cls.__setattr__ = _frozen_setattr(cls, all_fields)
        cls.__delattr__ = _frozen_delattr(cls, all_fields)
    # dataclasses' hash table for unsafe_hash=False: a class's own __hash__ stays; otherwise a
    # frozen eq record hashes its hashed fields and a mutable eq record is unhashable
    own_hash = cls.__dict__.get("__hash__", MISSING)
    explicit_hash = not (own_hash is MISSING or (own_hash is None and "__eq__" in cls.__dict__))
    if eq and not explicit_hash:
        if frozen:
            hashed = _values(tuple(f.name for f in listed if (f.compare if f.hash is None else f.hash)))
            cls.__hash__ = lambda self: hash(hashed(self))
        else:
            cls.__hash__ = None
    if "__match_args__" not in cls.__dict__:
        cls.__match_args__ = tuple(f.name for f in init_fields)  # type: ignore[misc]
    return cls


def _init(cls: type, init_fields: tuple[Field, ...], later: tuple[Field, ...]) -> Callable[..., None]:
    names = tuple(f.name for f in init_fields)
    accepted = frozenset(names)
    count = len(names)
    plain_defaults = {f.name: f.default for f in init_fields if f.default is not MISSING}
    factories = tuple((f.name, f.default_factory) for f in init_fields if f.default_factory is not MISSING)
    # a field outside __init__ is set per instance only from a factory; a plain default stays
    # the class attribute (as in dataclasses)
    later_factories = tuple((f.name, f.default_factory) for f in later if f.default_factory is not MISSING)
    defaulted = frozenset(plain_defaults).union(name for name, _ in factories)
    post_init = hasattr(cls, "__post_init__")
    qualname = f"{cls.__qualname__}.__init__()"

    def refuse(args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError:
        """The error Python gives for a bad call (the slow path: only a bad call gets here)."""
        if len(args) > count:
            return TypeError(f"{qualname} takes {count + 1} positional arguments but {len(args) + 1} were given")
        for name in kwargs:
            if name not in accepted:
                return TypeError(f"{qualname} got an unexpected keyword argument {name!r}")
            if name in names[:len(args)]:
                return TypeError(f"{qualname} got multiple values for argument {name!r}")
        missing = [n for n in names[len(args):] if n not in kwargs and n not in defaulted]
        return TypeError(f"{qualname} missing {len(missing)} required argument(s): "
                         + ", ".join(repr(n) for n in missing))

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The field values of a call that does not pass every field positionally."""
        given = len(args)
        if given > count or (kwargs and (not accepted.issuperset(kwargs)
                                         or not kwargs.keys().isdisjoint(names[:given]))):
            raise refuse(args, kwargs)
        values = plain_defaults.copy()
        values.update(zip(names, args))
        values.update(kwargs)
        for name, factory in factories:
            if name not in values:
                values[name] = factory()
        if len(values) < count:
            raise refuse(args, kwargs)
        return values

    # object.__setattr__ per field, as dataclasses does: touching self.__dict__ would give the
    # instance a real dict and make every later attribute read about three times slower
    set_field = object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, value in (bind(args, kwargs).items() if kwargs or len(args) != count else zip(names, args)):
            set_field(self, name, value)
        for name, factory in later_factories:
            set_field(self, name, factory())
        if post_init:
            self.__post_init__()

    __init__.__qualname__ = qualname[:-2]
    return __init__


def _repr(names: tuple[str, ...]) -> Callable[[object], str]:
    def __repr__(self: object) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__


def _comparison(values: Callable[[object], tuple[Any, ...]],
                op: Callable[[Any, Any], bool]) -> Callable[[object, object], Any]:
    def compare(self: object, other: object) -> Any:
        if other.__class__ is self.__class__:
            return op(values(self), values(other))
        return NotImplemented

    return compare


def _frozen_setattr(cls: Any, all_fields: dict[str, Field]) -> Callable[[object, str, object], None]:
    def __setattr__(self: Any, name: str, value: object) -> None:
        if type(self) is cls or name in all_fields:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr(cls: Any, all_fields: dict[str, Field]) -> Callable[[object, str], None]:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in all_fields:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__

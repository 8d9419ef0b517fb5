"""What a run's gin config resolves to: the value of every parameter of every configurable the
run calls, which binding set it, what that binding overrode, and which bindings do nothing.

The run is followed from its entry point (`train`, `evaluate` or `infer`) the way gin evaluates
it, without calling anything: a configurable's parameters come from the bindings whose scope is a
prefix of the scope it is called in (the longest scope wins); a scoped reference `@s/X()` calls X
in scope `s`; an unscoped one in the caller's scope; a macro `%M` is evaluated in scope `M`. A
binding no reached call takes is "unused": it changes nothing, which is usually a typo.

Configurables that library code calls directly (t5's and seqio's preprocessors, for example) are
invisible to this walk; their bindings are listed as "not checked" rather than unused.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Iterable, Iterator, Sequence

import gin

from t5x_lite.config import macro_defaults, parsing, registry, t5x_macros
from t5x_lite.config import sources as config_sources
from t5x_lite.config.parsing import ConfigError
from t5x_lite.config.sources import Binding

ENTRY_POINTS = ("train", "evaluate", "infer")
REQUIRED = "<required>"


@dataclasses.dataclass
class Setting:
    """The final binding of one key and the earlier bindings of that key it overrode, in order."""

    binding: Binding
    overridden: list[Binding] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> str:
        return self.binding.key


@dataclasses.dataclass(frozen=True)
class Call:
    """A configurable called by the run, in a scope."""

    scope: tuple[str, ...]
    configurable: str  # gin's full selector
    name: str  # its registered name

    @property
    def label(self) -> str:
        return "/".join([*self.scope, self.name])


@dataclasses.dataclass
class Parameter:
    """One parameter of a call: its value (macros substituted) and the setting that gave it.

    `setting` is None when the value is the signature's default. `shadowed` are settings that
    also apply in this scope but lose to a more specific scope.
    """

    name: str
    value: Any
    setting: Setting | None
    shadowed: list[Setting] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class DeferredCall:
    """A configurable call that ResolvedConfig.build was asked not to make: its name and arguments."""

    name: str
    kwargs: dict


@dataclasses.dataclass
class ResolvedConfig:
    """The run as gin will call it. `calls` is in the order the walk from `entry` reaches them."""

    entry: str
    settings: dict[tuple, Setting]
    calls: list[tuple[Call, list[Parameter]]]
    unused: list[Setting]
    not_checked: list[Setting]

    def macro(self, name: str) -> Setting | None:
        return self.settings.get(("macro", name))

    def build(self, value: Any, scope: tuple[str, ...] = (), *, defer: Iterable[str] = ()) -> Any:
        """`value` evaluated as gin would, without gin: macros followed, each `@X()` replaced by X
        called with its resolved arguments in the scope gin would call it in.

        References to configurables named in `defer` are not called: they become DeferredCall
        (the name and built arguments), for a caller that wants to know what would be called.
        """
        defer = frozenset(defer)
        if isinstance(value, gin.config.ConfigurableReference):
            if _is_macro(value):
                setting = self.macro("/".join(value.scopes))
                return self.build(setting.binding.value, tuple(value.scopes), defer=defer) if setting else value
            call = Call(tuple(value.scopes) or scope, value.configurable.selector, value.configurable.name)
            if not value.evaluate:
                return value.configurable.wrapped
            kwargs = {p.name: self.build(p.setting.binding.value, call.scope, defer=defer)
                      for p in _parameters(call, self.settings) if p.setting is not None}
            if call.name in defer:
                return DeferredCall(call.name, kwargs)
            return value.configurable.wrapped(**kwargs)
        if isinstance(value, (list, tuple)):
            return type(value)(self.build(v, scope, defer=defer) for v in value)
        if isinstance(value, dict):
            return {self.build(k, scope, defer=defer): self.build(v, scope, defer=defer) for k, v in value.items()}
        return value

    def build_macro(self, name: str) -> Any:
        """The value of macro `name`, built (REQUIRED when the config does not set it)."""
        setting = self.macro(name)
        return REQUIRED if setting is None else self.build(setting.binding.value, tuple(name.split("/")))

    def values(self) -> dict[str, str]:
        """'call.param' -> the value as gin text, for every parameter of every call (defaults too)."""
        return {f"{call.label}.{p.name}": format_value(p.value) for call, params in self.calls for p in params}


def group_settings(bindings: Iterable[Binding]) -> dict[tuple, Setting]:
    """Bindings of the same key (scope, configurable, parameter, or macro name) → one Setting."""
    settings: dict[tuple, Setting] = {}
    for binding in bindings:
        key = ("macro", binding.key) if binding.is_macro else (binding.scope, binding.configurable, binding.param)
        if key in settings:
            previous = settings[key]
            settings[key] = Setting(binding, [*previous.overridden, previous.binding])
        else:
            settings[key] = Setting(binding)
    return settings


def pick_entry(settings: dict[tuple, Setting], entry: str | None = None) -> str:
    """The run's entry point: `entry` if given, else the one entry point the config binds."""
    if entry is not None:
        if entry not in ENTRY_POINTS:
            raise ConfigError(f"Unknown entry point {entry!r}; choose one of {list(ENTRY_POINTS)}.")
        return entry
    selectors = {name: match.selector for name in ENTRY_POINTS if (match := gin.config._REGISTRY.get_match(name))}  # noqa: SLF001
    bound = [name for name, sel in selectors.items() if any(k[0] != "macro" and k[1] == sel for k in settings)]
    if len(bound) != 1:
        found = f"it binds {', '.join(bound)}" if bound else "it binds none of them"
        raise ConfigError(f"Cannot tell the run's entry point ({', '.join(ENTRY_POINTS)}): {found}. "
                          "Name it with --entry=train, --entry=evaluate or --entry=infer.")
    return bound[0]


def load_run(*, gin_files: Sequence[str], gin_bindings: Sequence[str] = (), gin_search_paths: Sequence[str] = (),
             entry: str | None = None, skip_unknown: bool = False, check_macros: bool = True) -> ResolvedConfig:
    """Parses the gin files and flags into gin (which reports syntax errors and unknown names with
    their file and line), then resolves the run they configure.

    check_macros: an undefined macro is an error (False: left as a reference, for callers such
    as `estimate` that need only part of the run).
    """

    parsing.parse(gin_files=gin_files, gin_bindings=gin_bindings, gin_search_paths=gin_search_paths,
                 skip_unknown=skip_unknown)
    bindings = config_sources.read_bindings(gin_files=gin_files, gin_bindings=gin_bindings,
                                            gin_search_paths=gin_search_paths, skip_unknown=skip_unknown)
    bindings = [*bindings, *macro_defaults.bind_unset_defaults(bindings, macros_used)]
    macro_defaults.check_aliases(bindings, macros_used)
    t5x_macros.check_refused(bindings, macros_used)
    if check_macros:
        check_macros_defined(bindings)
    return resolve(bindings, entry=entry)


def check_macros_defined(bindings: Sequence[Binding]) -> None:
    """A ConfigError naming the file and line of each %MACRO used but never set (and the nearest set one).

    Only the bindings gin will use count: a macro read only by a binding that a later one
    overrides is not needed.
    """
    defined = {b.key for b in bindings if b.is_macro}
    problems = []
    for binding in {b.key: b for b in bindings}.values():
        for name in macros_used(binding.value):
            if name not in defined:
                close = difflib.get_close_matches(name, sorted(defined), n=2)
                hint = f"; did you mean %{' or %'.join(close)}?" if close else f"; set it, e.g. --gin.{name}=VALUE."
                problems.append(f"%{name} is used but never set\n  at {binding.source}: {binding.text}{hint}")
    if problems:
        raise ConfigError("\n".join(problems))


def resolve(bindings: Iterable[Binding], *, entry: str | None = None) -> ResolvedConfig:
    """Follows the run from its entry point; returns every call's parameters and the unused bindings."""
    settings = group_settings(bindings)
    entry = pick_entry(settings, entry)
    match = gin.config._REGISTRY.get_match(entry)  # noqa: SLF001
    if match is None:
        raise ConfigError(f"The entry point {entry!r} is not registered; call registry.register_configurables().")
    used: set[int] = set()
    calls: list[tuple[Call, list[Parameter]]] = []
    seen: set[Call] = set()
    pending = [Call((), match.selector, match.name)]
    while pending:
        call = pending.pop(0)
        if call in seen:
            continue
        seen.add(call)
        params = _parameters(call, settings)
        calls.append((call, params))
        for p in params:
            if p.setting is not None:
                used.add(id(p.setting))
                pending.extend(_references(p.setting.binding.value, call.scope, settings, used))
    unused, not_checked = [], []
    for setting in settings.values():
        if id(setting) in used:
            continue
        own = setting.binding.is_macro or _is_own(setting.binding.configurable)
        (unused if own else not_checked).append(setting)
    resolved = ResolvedConfig(entry, settings, calls, unused, not_checked)
    for _, params in calls:
        for p in params:
            if p.setting is not None:
                p.value = substitute_macros(p.value, resolved)
    return resolved


def _parameters(call: Call, settings: dict[tuple, Setting]) -> list[Parameter]:
    """The call's parameters: the most specific applicable setting, else the signature default."""
    applicable: dict[str, list[Setting]] = {}
    for key, setting in settings.items():
        if key[0] == "macro" or key[1] != call.configurable:
            continue
        scope = tuple(filter(None, key[0].split("/")))
        if call.scope[:len(scope)] == scope:
            applicable.setdefault(key[2], []).append(setting)
    params = []
    for name, default in _signature(call.configurable).items():
        candidates = sorted(applicable.pop(name, []), key=lambda s: len(s.binding.scope.split("/")) if s.binding.scope else 0)
        if candidates:
            winner = candidates[-1]
            params.append(Parameter(name, winner.binding.value, winner, candidates[:-1]))
        else:
            params.append(Parameter(name, default, None))
    for name, candidates in applicable.items():  # bound, but not in the signature (a **kwargs function)
        params.append(Parameter(name, candidates[-1].binding.value, candidates[-1], candidates[:-1]))
    return params


def _signature(selector: str) -> dict[str, Any]:
    """Parameter name → default (REQUIRED when it has none) of a registered configurable."""
    wrapped = gin.config._REGISTRY[selector].wrapped  # noqa: SLF001
    try:
        signature = inspect.signature(wrapped)
    except (TypeError, ValueError):
        return {}
    return {name: REQUIRED if p.default is inspect.Parameter.empty else p.default
            for name, p in signature.parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}


def _is_own(selector: str) -> bool:
    """A t5x_lite configurable (bound only through gin references), not a library's own callee."""
    configurable = gin.config._REGISTRY.get(selector)  # noqa: SLF001
    return configurable is not None and registry.is_own(configurable.wrapped)


def _is_macro(reference: gin.config.ConfigurableReference) -> bool:
    return reference.configurable.wrapped is gin.config.macro


def _walk(value: Any) -> Iterator[gin.config.ConfigurableReference]:
    if isinstance(value, gin.config.ConfigurableReference):
        yield value
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(k)
            yield from _walk(v)


def macros_used(value: Any) -> list[str]:
    """The names of the %MACROs a bound value reads, in order."""
    return ["/".join(ref.scopes) for ref in _walk(value) if _is_macro(ref)]


def _references(value: Any, scope: tuple[str, ...], settings: dict[tuple, Setting], used: set[int],
                depth: int = 0) -> Iterator[Call]:
    """The calls a value makes when gin evaluates it in `scope` (macros followed, marked used)."""
    for ref in _walk(value):
        if _is_macro(ref):
            setting = settings.get(("macro", "/".join(ref.scopes)))
            if setting is not None and depth < 50:
                used.add(id(setting))
                yield from _references(setting.binding.value, tuple(ref.scopes), settings, used, depth + 1)
        else:
            yield Call(tuple(ref.scopes) or scope, ref.configurable.selector, ref.configurable.name)


def substitute_macros(value: Any, resolved: ResolvedConfig, depth: int = 0) -> Any:
    """`value` with each %MACRO replaced by the macro's own (resolved) value."""
    if isinstance(value, gin.config.ConfigurableReference):
        setting = resolved.macro("/".join(value.scopes)) if _is_macro(value) else None
        if setting is None or depth > 50:
            return value
        return substitute_macros(setting.binding.value, resolved, depth + 1)
    if isinstance(value, (list, tuple)):
        return type(value)(substitute_macros(v, resolved, depth) for v in value)
    if isinstance(value, dict):
        return {substitute_macros(k, resolved, depth): substitute_macros(v, resolved, depth) for k, v in value.items()}
    return value


def format_value(value: Any) -> str:
    """A value as gin text (references as @name(), macros as %NAME)."""
    return value if value is REQUIRED else repr(value)

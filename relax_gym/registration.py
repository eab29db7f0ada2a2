"""Register, look up and make environments, and group them into evaluation suites.

Ids follow Gymnasium's rules: ``[namespace/]Name[-vN]``. Shipped envs live in the ``relax/``
namespace; third-party packages add theirs through the entry-point group ``relax_gym.envs``
(each entry point is a zero-argument callable that calls :func:`register`), loaded lazily the
first time an id is looked up or the registry is listed::

    [project.entry-points."relax_gym.envs"]
    acme = "acme.envs:register_all"

Registering stores only the entry point string, so listing envs imports nothing heavy.

Ids are first come, first served: registering an id that is already registered raises, and so
does an id in the ``relax/`` namespace, which is reserved for the envs shipped with relax-gym
(whether or not they are loaded yet), so a user env or a plugin can never silently stand in for
a shipped one. ``override=True`` replaces on purpose, with a warning. A plugin whose hook
raises -- for instance because it registers a shipped id -- is reported as failed and the
shipped env stays.
"""

from __future__ import annotations

import contextvars
import difflib
import importlib
import operator
import re
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any

import numpy as np

from relax_gym.core import Env, EpisodeGuard
from relax_gym.errors import RegistrationError, RelaxGymError
from relax_gym.types import MODALITIES

ENV_ID_RE = re.compile(
    r"^(?:(?P<namespace>[\w:-]+)\/)?(?:(?P<name>[\w:.-]+?))(?:-v(?P<version>\d+))?$"
)
PLUGIN_GROUP = "relax_gym.envs"
RESERVED_NAMESPACES: frozenset[str] = frozenset({"relax"})  # the envs and suites shipped with relax-gym
_SHIPPING = contextvars.ContextVar("relax_gym_shipping", default=False)


@contextmanager
def shipped_registration() -> Iterator[None]:
    """Let :func:`register` / :func:`register_suite` claim ids in the reserved namespaces.
    Only ``relax_gym.envs.register_envs`` (the shipped envs) uses it."""
    token = _SHIPPING.set(True)
    try:
        yield
    finally:
        _SHIPPING.reset(token)


def _claim(kind: str, name: str, namespace: str | None, exists: bool, override: bool) -> None:
    """Refuse to shadow: an existing id, or one in a reserved namespace, needs ``override=True``
    (which warns); the shipped package's own registration needs neither."""
    if not isinstance(override, bool):
        raise RegistrationError(f"{name}: override must be True or False, got {override!r}")
    reserved = namespace in RESERVED_NAMESPACES and not _SHIPPING.get()
    if not (exists or reserved):
        return
    if not override:
        why = (
            f"{kind} {name!r} is already registered"
            if exists
            else f"the {namespace!r} namespace is reserved for the {kind}s shipped with relax-gym"
        )
        raise RegistrationError(
            f"cannot register {kind} {name!r}: {why}; use your own namespace (e.g. 'myorg/...'), "
            "or pass override=True to replace it on purpose"
        )
    what = "replaces the registered one" if exists else "takes the place of the shipped one, if any"
    warnings.warn(f"overriding {kind} {name!r}: override=True {what}", stacklevel=3)


def parse_env_id(env_id: str) -> tuple[str | None, str, int | None]:
    """Split ``ns/Name-v3`` into ``("ns", "Name", 3)``; raise on a malformed id."""
    match = ENV_ID_RE.fullmatch(env_id) if isinstance(env_id, str) else None
    if not match:
        raise RegistrationError(
            f"malformed environment id {env_id!r}; expected '[namespace/]Name[-vN]', "
            "e.g. 'relax/Maze-v0'"
        )
    ns, name, version = match.group("namespace", "name", "version")
    return ns, name, int(version) if version is not None else None


def _join_id(ns: str | None, name: str, version: int | None) -> str:
    return f"{ns + '/' if ns else ''}{name}{f'-v{version}' if version is not None else ''}"


# keyword -> "module:function(env, value) -> env": wrappers any env takes through its kwargs.
# Named by string (like the CLI's subcommands), so the core imports no tools module.
WRAPPER_KWARGS: dict[str, str] = {"mcp_servers": "relax_gym.tools.mcp:with_mcp_servers"}


@dataclass
class EnvSpec:
    """Everything needed to build an environment, and what it declares about itself.

    ``modalities``, ``tags`` and ``max_turns`` default to the env class's own attributes; set
    them here to describe an env without importing it.
    """

    id: str
    entry_point: str | Callable[..., Env]
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    modalities: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    nondeterministic: bool = False
    description: str = ""
    namespace: str | None = field(init=False)
    name: str = field(init=False)
    version: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.namespace, self.name, self.version = parse_env_id(self.id)
        _check_entry_point(self.id, self.entry_point)
        if not isinstance(self.kwargs, Mapping) or not all(isinstance(k, str) for k in self.kwargs):
            raise RegistrationError(f"{self.id}: kwargs must be a dict with str keys, got {self.kwargs!r:.80}")
        self.kwargs = dict(self.kwargs)
        if self.max_turns is not None:
            self.max_turns = _int(f"{self.id}: max_turns", self.max_turns, 1)
        if self.modalities is not None:
            self.modalities = _names(self.id, "modalities", self.modalities)
            unknown = set(self.modalities) - set(MODALITIES)
            if unknown:
                raise RegistrationError(
                    f"{self.id}: unknown modalities {sorted(unknown)}; allowed: {list(MODALITIES)}"
                )
        if self.tags is not None:
            self.tags = _names(self.id, "tags", self.tags)
        if not isinstance(self.nondeterministic, bool):
            raise RegistrationError(f"{self.id}: nondeterministic must be True or False, got {self.nondeterministic!r}")
        if not isinstance(self.description, str):
            raise RegistrationError(f"{self.id}: description must be a str, got {type(self.description).__name__}")

    def load(self) -> Callable[..., Env]:
        """Import and return the entry point (a class or factory)."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, sep, attr = self.entry_point.partition(":")
        if not sep or not module_name or not attr:
            raise RegistrationError(
                f"{self.id}: entry_point {self.entry_point!r} must look like 'package.module:Name'"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RegistrationError(f"{self.id}: cannot import {module_name!r}: {exc}") from exc
        try:
            obj = getattr(module, attr)
        except AttributeError:
            raise RegistrationError(f"{self.id}: module {module_name!r} has no attribute {attr!r}") from None
        return obj

    def make(self, *, max_turns: int | None = None, **kwargs: Any) -> EpisodeGuard:
        """Build the env with ``self.kwargs`` updated by ``kwargs``, wrapped in EpisodeGuard.

        Keywords in :data:`WRAPPER_KWARGS` (``mcp_servers``) are taken by a wrapper around the
        env rather than passed to it, so every env accepts them."""
        factory = self.load()
        merged = {**self.kwargs, **kwargs}
        own = {k: v for k, v in merged.items() if k not in WRAPPER_KWARGS}
        try:
            env = factory(**own)
        except RelaxGymError:
            raise
        except (TypeError, ValueError) as exc:
            raise RegistrationError(f"{self.id}: cannot build with arguments {own}: {exc}") from exc
        if not isinstance(env, Env):
            raise RegistrationError(
                f"{self.id}: entry point returned {type(env).__name__}, which is not a relax_gym.Env"
            )
        env.unwrapped.spec = replace(self, kwargs=merged)  # type: ignore[assignment]
        limit = self.max_turns
        for key, target in WRAPPER_KWARGS.items():
            if merged.get(key):
                limit = None  # a wrapper (tools) lengthens episodes: its own max_turns stands
                module_name, _, attr = target.partition(":")
                try:
                    env = getattr(importlib.import_module(module_name), attr)(env, merged[key])
                except BaseException:
                    env.close()
                    raise
        return EpisodeGuard(env, max_turns=max_turns or limit or env.max_turns)

    # -- declared properties, falling back to the class attributes -----------------------------
    def _target_class(self) -> Any:
        """The env class behind the entry point: itself, or a factory's ``env_class``."""
        target = self.load()
        return getattr(target, "env_class", target)

    def _cls_attr(self, attr: str, default: Any) -> Any:
        target = self._target_class()
        return getattr(target, attr, default) if isinstance(target, type) else default

    def resolved_modalities(self) -> tuple[str, ...]:
        return self.modalities if self.modalities is not None else tuple(self._cls_attr("modalities", ("text",)))

    def resolved_tags(self) -> tuple[str, ...]:
        return self.tags if self.tags is not None else tuple(self._cls_attr("tags", ()))

    def resolved_max_turns(self) -> int:
        return self.max_turns if self.max_turns is not None else int(self._cls_attr("max_turns", 1))

    def has_oracle(self) -> bool:
        target = self._target_class()
        return isinstance(target, type) and getattr(target, "oracle", Env.oracle) is not Env.oracle

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly description for listings."""
        return {
            "id": self.id,
            "modalities": list(self.resolved_modalities()),
            "tags": list(self.resolved_tags()),
            "max_turns": self.resolved_max_turns(),
            "oracle": self.has_oracle(),
            "description": self.description or _first_doc_line(self.load()),
        }


def _check_entry_point(env_id: str, entry_point: Any) -> None:
    """A callable, or ``"package.module:Name"`` (checked now, imported only when made)."""
    if callable(entry_point):
        return
    if not isinstance(entry_point, str):
        raise RegistrationError(
            f"{env_id}: entry_point must be a callable or a 'package.module:Name' string, "
            f"got {type(entry_point).__name__}"
        )
    module_name, sep, attr = entry_point.partition(":")
    if not (sep and attr.isidentifier() and all(part.isidentifier() for part in module_name.split("."))):
        raise RegistrationError(f"{env_id}: entry_point {entry_point!r:.120} must look like 'package.module:Name'")


def _int(what: str, value: Any, minimum: int | None = None) -> int:
    """An int (numpy ints too; bools, floats and strings are refused), at least ``minimum``."""
    number = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            pass
    if number is None or (minimum is not None and number < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise RegistrationError(f"{what} must be an int{bound}, got {value!r:.80}")
    return number


def _names(env_id: str, what: str, values: Any) -> tuple[str, ...]:
    """A list of names as a tuple; a bare string (which would split into letters) is refused."""
    if isinstance(values, str) or not isinstance(values, Sequence | set | frozenset):
        raise RegistrationError(f"{env_id}: {what} must be a list of str, got {values!r:.80}")
    out = tuple(values)
    if not all(isinstance(v, str) for v in out):
        raise RegistrationError(f"{env_id}: {what} must be a list of str, got {out!r:.80}")
    return out


def _first_doc_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


# ------------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------------
registry: dict[str, EnvSpec] = {}
_plugins_loaded = False
_plugins_lock = threading.RLock()
_plugins_loading = False
plugin_errors: dict[str, str] = {}


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    kwargs: dict[str, Any] | None = None,
    *,
    max_turns: int | None = None,
    modalities: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
    nondeterministic: bool = False,
    description: str = "",
    override: bool = False,
) -> EnvSpec:
    """Register an environment under ``id`` (every argument is checked now, not at ``make``).

    An id that is already registered, or one in the reserved ``relax/`` namespace of the
    shipped envs, raises :class:`RegistrationError`; ``override=True`` replaces it on purpose
    (with a warning).
    """
    spec = EnvSpec(
        id=id,
        entry_point=entry_point,
        kwargs={} if kwargs is None else kwargs,
        max_turns=max_turns,
        modalities=modalities,  # type: ignore[arg-type]  # checked and made a tuple by EnvSpec
        tags=tags,  # type: ignore[arg-type]
        nondeterministic=nondeterministic,
        description=description,
    )
    for other in registry.values():
        if (other.namespace, other.name) == (spec.namespace, spec.name) and other.id != spec.id:
            if (other.version is None) != (spec.version is None):
                raise RegistrationError(
                    f"cannot register {spec.id!r}: {other.id!r} exists, and an env name may not "
                    "be both versioned and unversioned"
                )
    _claim("environment", id, spec.namespace, id in registry, override)
    registry[id] = spec
    return spec


def deregister(id: str) -> None:
    """Remove an environment from the registry."""
    if id not in registry:
        raise RegistrationError(f"no environment {id!r} to deregister")
    del registry[id]


def load_plugins(*, force: bool = False) -> None:
    """Run every ``relax_gym.envs`` entry point once; a failing plugin is recorded, not fatal.

    Thread-safe: concurrent first lookups wait for the one loading the plugins, so none of them
    sees a half-filled registry. (The lock is re-entrant because a plugin's hook may look up envs.)
    """
    global _plugins_loaded
    if _plugins_loaded and not force:
        return
    global _plugins_loading
    with _plugins_lock:
        if (_plugins_loaded and not force) or _plugins_loading:  # loading: a hook looked an env up
            return
        _plugins_loading = True
        try:
            _run_plugin_hooks()
        finally:
            _plugins_loading = False
        _plugins_loaded = True


def _run_plugin_hooks() -> None:
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            hook = ep.load()
            if callable(hook):
                hook()
            plugin_errors.pop(ep.name, None)
        except Exception as exc:  # one broken plugin must not hide every other env
            plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"relax_gym plugin {ep.name!r} ({ep.value}) failed to load: {exc}", stacklevel=2)


def spec(id: str) -> EnvSpec:
    """Look up a spec; an unversioned id resolves to its latest version."""
    ns, name, version = parse_env_id(id)
    found = _find(ns, name, version)
    if found is None:
        load_plugins()
        found = _find(ns, name, version)
    if found is None:
        versions = sorted(
            s.version for s in registry.values() if (s.namespace, s.name) == (ns, name) and s.version is not None
        )
        if versions:
            raise RegistrationError(
                f"environment {id!r} not found; registered versions: "
                + ", ".join(_join_id(ns, name, v) for v in versions)
            )
        close = difflib.get_close_matches(id, list(registry), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else "; run `relax-gym envs` to list them"
        errors = f" (plugins that failed to load: {', '.join(plugin_errors)})" if plugin_errors else ""
        raise RegistrationError(f"no environment registered as {id!r}{hint}{errors}")
    return found


def _find(ns: str | None, name: str, version: int | None) -> EnvSpec | None:
    exact = registry.get(_join_id(ns, name, version))
    if exact is not None or version is not None:
        return exact
    versions = [s for s in registry.values() if (s.namespace, s.name) == (ns, name) and s.version is not None]
    if not versions:
        return None
    latest = max(versions, key=lambda s: s.version or 0)
    warnings.warn(f"{_join_id(ns, name, None)!r} resolved to {latest.id!r}; pin the version", stacklevel=3)
    return latest


def make(id: str | EnvSpec, *, max_turns: int | None = None, **kwargs: Any) -> EpisodeGuard:
    """Build a registered environment: ``make("relax/Maze-v0", difficulty="hard")``."""
    env_spec = id if isinstance(id, EnvSpec) else spec(id)
    return env_spec.make(max_turns=max_turns, **kwargs)


def list_envs(
    *, modality: str | None = None, tag: str | None = None, namespace: str | None = None
) -> list[EnvSpec]:
    """Registered specs, sorted by id, optionally filtered (plugins are loaded first)."""
    load_plugins()
    out = []
    for s in sorted(registry.values(), key=lambda s: s.id):
        if namespace is not None and s.namespace != namespace:
            continue
        if modality is not None and modality not in s.resolved_modalities():
            continue
        if tag is not None and tag not in s.resolved_tags():
            continue
        out.append(s)
    return out


# ------------------------------------------------------------------------------------------------
# suites
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class EpisodeKey:
    """One evaluation episode: which env, which seed (and which of the env's episodes)."""

    env_id: str
    index: int
    seed: int


@dataclass(frozen=True)
class Suite:
    """A named, fixed list of environments evaluated for ``episodes_per_env`` seeds each.

    Seeds derive from (suite seed, env id, episode index) alone, so adding an env to a suite
    leaves every other env's episodes unchanged.
    """

    name: str
    env_ids: tuple[str, ...]
    episodes_per_env: int = 10
    seed: int = 0
    description: str = ""
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def episodes(self) -> list[EpisodeKey]:
        return [
            EpisodeKey(env_id, i, episode_seed(self.seed, env_id, i))
            for env_id in self.env_ids
            for i in range(self.episodes_per_env)
        ]

    def __iter__(self) -> Iterator[EpisodeKey]:
        return iter(self.episodes())

    def __len__(self) -> int:
        return len(self.env_ids) * self.episodes_per_env


def episode_seed(suite_seed: int, env_id: str, index: int) -> int:
    """A stable 31-bit seed for episode ``index`` of ``env_id`` (no dependence on hash())."""
    seq = np.random.SeedSequence([int(suite_seed) & 0xFFFFFFFF, zlib.crc32(env_id.encode()), int(index)])
    return int(seq.generate_state(1, dtype=np.uint32)[0] >> 1)


suites: dict[str, Suite] = {}


def register_suite(
    name: str,
    env_ids: Sequence[str],
    episodes_per_env: int = 10,
    seed: int = 0,
    *,
    description: str = "",
    env_kwargs: dict[str, dict[str, Any]] | None = None,
    override: bool = False,
) -> Suite:
    """Register a suite of env ids (their envs are looked up lazily, when the suite is made).
    Like :func:`register`, an existing name or one in the reserved ``relax/`` namespace needs
    ``override=True``."""
    if not isinstance(name, str) or not name:
        raise RegistrationError(f"a suite name must be a non-empty str, got {name!r:.80}")
    if isinstance(env_ids, str) or not isinstance(env_ids, Sequence):
        raise RegistrationError(f"suite {name!r}: env_ids must be a list of env ids, got {env_ids!r:.80}")
    if not env_ids:
        raise RegistrationError(f"suite {name!r} needs at least one env id")
    episodes_per_env = _int(f"suite {name!r}: episodes_per_env", episodes_per_env, 1)
    seed = _int(f"suite {name!r}: seed", seed)
    for env_id in env_ids:
        parse_env_id(env_id)
    namespace = name.partition("/")[0] if "/" in name else None
    _claim("suite", name, namespace, name in suites, override)
    suite = Suite(name, tuple(env_ids), episodes_per_env, seed, description, dict(env_kwargs or {}))
    suites[name] = suite
    return suite


def make_suite(name: str, *, episodes_per_env: int | None = None) -> Suite:
    """Look up a suite (plugins loaded first) and check that all its envs exist."""
    if name not in suites:
        load_plugins()
    if name not in suites:
        close = difflib.get_close_matches(name, list(suites), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise RegistrationError(f"no suite registered as {name!r}{hint}")
    suite = suites[name]
    for env_id in suite.env_ids:
        spec(env_id)
    if episodes_per_env is not None:
        suite = replace(suite, episodes_per_env=int(episodes_per_env))
    return suite


def list_suites() -> list[Suite]:
    load_plugins()
    return [suites[k] for k in sorted(suites)]

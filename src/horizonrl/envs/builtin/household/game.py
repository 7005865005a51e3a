"""ALFWorld games through textworld: the shipped PDDL domain and grammar, rendered like ``PddlEnv``.

``alfworld`` ships ``alfred.pddl`` (the domain) and ``alfred.twl2`` (textworld's
PDDL grammar: one command template and one feedback rule per action, plus the
text of the intro, ``look``, ``examine`` ...). textworld's ``PddlEnv`` plays a
game made of these two files and a PDDL problem; it grounds actions with
``fast_downward`` (textworld's ``[pddl]`` extra), which this project does not
install. :class:`HouseholdGame` therefore does what ``PddlEnv`` does with the
grounding done by :mod:`horizonrl.envs.builtin.household.pddl`:

- the grammar file is parsed by textworld's own tw-pddl parser
  (``textworld/envs/pddl/logic/parser.py``, loaded by path because its package
  ``__init__`` imports ``fast_downward``) and turned into textworld's
  ``ContextSensitiveGrammar``;
- the facts are mirrored into a ``textworld.logic.State`` (lowercased names,
  typed ``Variable``s, and ``not_<pred>`` facts for atoms deleted by an action,
  as ``PddlState.apply`` records them), which the grammar's conditions query;
- the intro is ``#intro#``, the feedback of an action its ``feedback`` rule and
  the admissible commands the templates of the applicable actions, each derived
  with the action's parameter mapping, then sorted and deduplicated; a command
  that is not admissible gives ``Nothing happens.``;
- the task sentence replaces ``UNKNOWN GOAL`` in the ``task`` rule, as ALFWorld's
  ``add_task_to_grammar`` does, and entities are shown by display names
  (``apple 1``) as ALFWorld's demangler shows them.

A game state is a ``frozenset`` of atoms, so copying it is a complete snapshot.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import importlib.util
import json
import re
import sys
import textwrap
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import textworld.envs.pddl
import textworld.logic
from textworld.envs.pddl import textgen
from textworld.envs.pddl.textgen import ContextSensitiveGrammar
from textworld.generator.game import EntityInfo

from horizonrl.envs.builtin.household.pddl import Atom, Domain, World, parse_domain, parse_problem

NOTHING_HAPPENS = "Nothing happens."
GroundAction = tuple[str, tuple[str, ...]]


def shipped_file(name: str) -> str:
    """Text of a data file shipped by the installed ``alfworld`` package (``alfred.pddl``, ``alfred.twl2``).

    Only the package's data directory is read; no ``alfworld`` module is imported.
    """
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the household environment needs the 'alfworld' package for its data file {name!r}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"alfworld does not ship {name!r} (looked at {path})")
    return path.read_text()


def _load_tw_module(name: str) -> ModuleType:
    """textworld's ``textworld/envs/pddl/logic/<name>.py`` as a standalone module (no fast_downward)."""
    key = f"_horizonrl_tw_pddl_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = Path(textworld.envs.pddl.__file__).parent / "logic" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load textworld's PDDL grammar {name} module from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # dataclasses in model.py look their module up here
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class ActionText:
    """The grammar of one action: command template and feedback rule (as in textworld's ``Action``)."""

    name: str
    template: str
    feedback_rule: str


@dataclass(frozen=True)
class Logic:
    """The shipped domain plus the parsed tw-pddl grammar (actions and the shared grammar)."""

    domain: Domain
    actions: dict[str, ActionText]
    grammar: ContextSensitiveGrammar
    command_cache: dict[tuple, str] = field(default_factory=dict, compare=False, repr=False)


_LOCK = threading.Lock()


@functools.cache
def shipped_logic() -> Logic:
    """The domain and grammar that ``alfworld`` ships, parsed once per process."""
    with _LOCK:
        parser_mod, model_mod = _load_tw_module("parser"), _load_tw_module("model")
    parser = parser_mod.PddlLogicParser(semantics=model_mod.PddlLogicModelBuilderSemantics(), parseinfo=True)
    document = parser.parse(shipped_file("alfred.twl2"), rule_name="pddlStart")
    actions: dict[str, ActionText] = {}
    rules: dict[str, Any] = {}
    for part in document.parts:  # what textworld's _ModelConverter does
        if isinstance(part, model_mod.ActionTypeNode):
            actions[part.name.lower()] = ActionText(
                part.name.lower(), part.template.template[1:-1], part.feedback.name[1:-1]
            )
            if part.grammar:
                code = textwrap.dedent(part.grammar.code[3:-3])
                rules.update(
                    json.loads("\n".join(ln for ln in code.split("\n") if not ln.lstrip().startswith("#")))
                )
        elif isinstance(part, model_mod.ActionGrammarNode):
            rules.update(json.loads(textwrap.dedent(part.code[3:-3])))
    domain = parse_domain(shipped_file("alfred.pddl"))
    missing = sorted(set(domain.actions) - set(actions))
    if missing:
        raise ValueError(f"alfred.twl2 has no template for domain actions {missing}")
    return Logic(domain, actions, ContextSensitiveGrammar.parse(json.dumps(rules)))


class HouseholdGame:
    """One game: the shipped logic, a PDDL problem, display names and the task sentence.

    Stateless apart from caches: every method takes the game state (a frozenset
    of atoms, including ``not_*`` bookkeeping atoms) explicitly.
    """

    def __init__(self, problem_text: str, names: dict[str, str], task: str) -> None:
        special = sorted(set(task) & set("#{}[]|\\"))
        if special:
            raise ValueError(f"task sentence {task!r} contains grammar symbols {special}")
        self.logic = shipped_logic()
        self.problem = parse_problem(problem_text)
        self.world = World(self.logic.domain, self.problem)
        self.task = task
        grammar = ContextSensitiveGrammar()
        task_rule = {"task": [{"rhs": f"Your task is to: {task}."}]}
        grammar.update(ContextSensitiveGrammar.parse(json.dumps(task_rule)))  # first rule wins
        grammar.update(self.logic.grammar)
        self.grammar = grammar
        self.types = textworld.logic.GameLogic()
        for typ in sorted(set(self.problem.objects.values()) | set(self.logic.domain.types)):
            self.types.types.add(textworld.logic.Type(typ, []))
        self.infos: dict[str, EntityInfo] = {}
        for obj, typ in self.problem.objects.items():
            info = EntityInfo(obj, typ)
            info.name = names.get(obj, obj)
            info.definite, info.indefinite = "the", "a"
            self.infos[obj] = info
        self._cache: dict[frozenset[Atom], list[tuple[str, GroundAction]]] = {}

    @property
    def initial_state(self) -> frozenset[Atom]:
        return self.problem.init

    def name(self, obj: str) -> str:
        return self.infos[obj].name

    # ------------------------------------------------------------------ textworld side

    def _variable(self, obj: str) -> textworld.logic.Variable:
        return textworld.logic.Variable(obj, self.problem.objects[obj])

    def tw_state(self, state: Iterable[Atom]) -> textworld.logic.State:
        """The facts as a ``textworld.logic.State`` that the grammar's conditions query."""
        props = [textworld.logic.Proposition(a[0], [self._variable(x) for x in a[1:]]) for a in state]
        return textworld.logic.State(self.types, props)

    def _context(self, tw: textworld.logic.State, action: GroundAction | None) -> dict[str, Any]:
        mapping: dict[Any, Any] = {}
        variables: dict[str, EntityInfo] = {}
        if action is not None:
            schema = self.logic.domain.actions[action[0]]
            for (param, typ), arg in zip(schema.parameters, action[1], strict=True):
                mapping[textworld.logic.Placeholder(param.lstrip("?"), typ)] = self._variable(arg)
                variables[param.lstrip("?")] = self.infos[arg]
        return {
            "state": tw,
            "facts": list(tw.facts),
            "variables": variables,
            "mapping": mapping,
            "entity_infos": self.infos,
        }

    def derive(self, start: str, state: Iterable[Atom], action: GroundAction | None = None) -> str:
        """Derive ``start`` (e.g. ``#intro#`` or a template) with textworld's grammar engine."""
        return derive(self.grammar, start, self._context(self.tw_state(state), action))

    def intro(self, state: frozenset[Atom]) -> str:
        """The opening text: welcome line, what the agent sees, and the task."""
        return self.derive("#intro#", state)

    def command(
        self, state: frozenset[Atom], action: GroundAction, tw: Callable[[], Any] | None = None
    ) -> str:
        """The command text of ``action`` in ``state`` (its template derived with the action's mapping).

        Memoized across games when the template is :func:`template_shape` simple (all
        templates of the shipped grammar are): the key holds the template, the type and
        display name of each parameter it shows, and which of its query atoms hold.
        """
        template = self.logic.actions[action[0]].template
        shape = template_shape(template)
        key = None
        if shape is not None:
            shown, queries = shape
            schema = self.logic.domain.actions[action[0]]
            params = {
                p.lstrip("?"): (typ, arg) for (p, typ), arg in zip(schema.parameters, action[1], strict=True)
            }
            if all(name in params and typ in ("", params[name][0]) for name, typ in shown):
                checks = tuple((pred, *(params[n][1] for n, _ in args)) in state for pred, args in queries)
                names = tuple((n, params[n][0], self.infos[params[n][1]].name) for n, _ in shown)
                key = (template, names, checks)
                hit = self.logic.command_cache.get(key)
                if hit is not None:
                    return hit
        tw_state = tw() if tw is not None else self.tw_state(state)
        text = derive(self.grammar, template, self._context(tw_state, action))
        if key is not None:
            if len(self.logic.command_cache) > 100_000:
                self.logic.command_cache.clear()
            self.logic.command_cache[key] = text
        return text

    def commands(self, state: frozenset[Atom]) -> list[tuple[str, GroundAction]]:
        """``(command, ground action)`` for every applicable action, sorted by command, one per command."""
        cached = self._cache.get(state)
        if cached is not None:
            return cached
        tw: list[Any] = []

        def lazy_tw() -> Any:  # built only when a template is not cached
            if not tw:
                tw.append(self.tw_state(state))
            return tw[0]

        by_text: dict[str, GroundAction] = {}
        for action in self.world.applicable(state):
            text = self.command(state, action, lazy_tw)
            by_text.setdefault(text, action)  # same command -> same result, as in PddlEnv
        out = sorted(by_text.items())
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[state] = out
        return out

    def admissible(self, state: frozenset[Atom]) -> list[str]:
        return [c for c, _ in self.commands(state)]

    def step(self, state: frozenset[Atom], command: str) -> tuple[frozenset[Atom], str, GroundAction | None]:
        """Apply ``command`` (exact admissible text); return (new state, feedback, action or None).

        An inadmissible command leaves the state unchanged with feedback ``Nothing happens.``.
        """
        action = dict(self.commands(state)).get(command.strip())
        if action is None:
            return state, NOTHING_HAPPENS, None
        new, feedback = self.play(state, action)
        return new, feedback, action

    def play(self, state: frozenset[Atom], action: GroundAction) -> tuple[frozenset[Atom], str]:
        """Apply an applicable ground action; return (new state, its feedback text)."""
        new = self.apply(state, action)
        return new, self.derive(self.logic.actions[action[0]].feedback_rule, new, action)

    def apply(self, state: frozenset[Atom], action: GroundAction) -> frozenset[Atom]:
        """The state after ``action``; deleted atoms leave a ``not_<pred>`` fact, added ones remove it."""
        adds, dels = self.world.apply(state, *action)
        negated = {(f"not_{a[0]}", *a[1:]) for a in dels - adds}
        cleared = {(f"not_{a[0]}", *a[1:]) for a in adds}
        return frozenset(((state - dels) | adds | negated) - cleared)

    def won(self, state: frozenset[Atom]) -> bool:
        return self.world.goal_reached(state)


@functools.cache
def _parsed(start: str) -> tuple[Any, ...]:
    """textworld's parse of a grammar string into symbols, memoized (parsing dominates a derive)."""
    return tuple(textgen._parse_and_convert(start, rule_name="symbols"))


def derive(grammar: ContextSensitiveGrammar, start: str, context: dict[str, Any]) -> str:
    """``ContextSensitiveGrammar.derive`` of textworld 1.7, with the parse of ``start`` memoized."""
    derivation = copy.deepcopy(list(_parsed(start)))[::-1]
    for symbol in derivation:
        symbol.context = textgen.copy_context(context)
    derived = []
    while derivation:
        symbol = derivation.pop()
        if isinstance(symbol, textgen.TerminalSymbol):
            derived.append(symbol)
        elif isinstance(symbol, textgen.NonterminalSymbol):
            derivation += grammar.replace(symbol)[::-1]
        elif isinstance(symbol, textgen.ConditionalSymbol | textgen.EvalSymbol | textgen.ListSymbol):
            derivation += symbol.derive()[::-1]
        else:
            raise TypeError(f"unknown grammar symbol {symbol!r} while deriving {start!r}")
    return "".join(map(str, derived))


_SIMPLE_EVAL = re.compile(r"([a-z_][a-z0-9_]*)(?:\.name)?")


@functools.cache
def template_shape(template: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, tuple], ...]] | None:
    """``(shown, queries)`` of a command template whose text depends only on what its mapping binds.

    ``shown``: ``(placeholder, type)`` of every parameter the template shows, as
    ``{x}`` or ``{x.name}`` (its display name) or inside a query; ``queries``:
    ``(predicate, ((placeholder, type), ...))`` of the ``[{... | query}]`` lists,
    whose placeholders must all be action parameters, so each query is a membership
    test of one ground atom. Any other construct (``#rule#``, other expressions)
    gives None: such a template is derived afresh every time.
    """
    shown: dict[str, str] = {}
    queries: list[tuple[str, tuple]] = []
    evals: list[str] = []
    stack = list(_parsed(template))
    while stack:
        symbol = stack.pop()
        if isinstance(symbol, textgen.ListSymbol):
            stack.append(symbol.symbol)
        elif isinstance(symbol, textgen.ConditionalSymbol):
            stack.append(symbol.expression)
            if symbol.given:
                rule = textworld.logic.Rule.parse_conjunctive_query(symbol.given)
                for pred in rule.preconditions:
                    args = tuple((ph.name, ph.type) for ph in pred.parameters)
                    queries.append((pred.name, args))
                    shown.update(args)
        elif isinstance(symbol, textgen.EvalSymbol):
            m = _SIMPLE_EVAL.fullmatch(symbol.expression.strip())
            if m is None:
                return None
            evals.append(m.group(1))
        elif not isinstance(symbol, textgen.TerminalSymbol):
            return None
    for name in evals:
        shown.setdefault(name, "")  # type unknown from the template: filled from the schema below
    return tuple(sorted(shown.items())), tuple(queries)


@functools.lru_cache(maxsize=64)
def load_game(problem_text: str, names_json: str, task: str) -> HouseholdGame:
    """A cached :class:`HouseholdGame` (``names_json`` is the JSON of the display-name map)."""
    return HouseholdGame(problem_text, json.loads(names_json), task)

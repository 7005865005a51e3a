"""A small PDDL interpreter: parse a domain and a problem, ground applicable actions, apply them.

It covers the ADL subset that ALFWorld's ``alfred.pddl`` uses: typed parameters,
``and``/``or``/``not``/``imply``/``exists``/``forall``/``=`` in preconditions and
goals, and ``and``/``not``/``when``/``forall`` effects (``increase`` cost effects
are ignored). PDDL is case-insensitive; every name is lowercased, as Fast
Downward (the grounder textworld's ``PddlEnv`` uses) does.

A ground atom is a tuple ``(predicate, arg, ...)``; a state is a ``frozenset`` of
the atoms that hold (closed world). Grounding is a join over the state's facts:
positive atoms bind variables from matching facts and only variables no atom
binds are enumerated over their type, so a step costs milliseconds on the small
problems the household generator writes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Atom = tuple[str, ...]
Cond = tuple[
    Any, ...
]  # ("atom", pred, *terms) | ("and"|"or", *conds) | ("not", c) | ("exists"|"forall", vars, c)
Binding = dict[str, str]


class PddlError(ValueError):
    """A PDDL text that this interpreter cannot parse or does not support."""


def parse_sexpr(text: str) -> list[Any]:
    """``text`` as nested lists of lowercased symbols (comments after ``;`` and commas dropped)."""
    text = re.sub(r";[^\n]*", " ", text).lower().replace(",", " ")
    tokens = re.findall(r"[()]|[^\s()]+", text)
    stack: list[list[Any]] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise PddlError("unbalanced ')' in PDDL text")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise PddlError(f"PDDL text has {len(stack) - 1} unclosed '('")
    return stack[0]


def parse_typed_list(items: list[Any]) -> list[tuple[str, str]]:
    """``[?a, -, agent, ?b, ?c, -, object]`` -> ``[(?a, agent), (?b, object), (?c, object)]``."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    i = 0
    while i < len(items):
        tok = items[i]
        if not isinstance(tok, str):
            raise PddlError(f"unexpected list {tok!r} in a typed list")
        if tok == "-":
            if i + 1 >= len(items) or not isinstance(items[i + 1], str):
                raise PddlError(f"'-' without a type in typed list {items!r}")
            out += [(name, items[i + 1]) for name in pending]
            pending = []
            i += 2
            continue
        pending.append(tok)
        i += 1
    return out + [(name, "object") for name in pending]


def parse_condition(expr: Any) -> Cond:
    """A precondition or goal expression as a nested tuple (see ``Cond``)."""
    if not isinstance(expr, list):
        raise PddlError(f"expected a condition, got symbol {expr!r}")
    if not expr:
        return ("and",)
    head, args = expr[0], expr[1:]
    if head in ("and", "or"):
        return (head, *(parse_condition(a) for a in args))
    if head == "not":
        return ("not", parse_condition(args[0]))
    if head == "imply":
        return ("or", ("not", parse_condition(args[0])), parse_condition(args[1]))
    if head in ("exists", "forall"):
        return (head, tuple(parse_typed_list(args[0])), parse_condition(args[1]))
    if head == "=":
        return ("=", args[0], args[1])
    if not isinstance(head, str) or not all(isinstance(a, str) for a in args):
        raise PddlError(f"unsupported condition {expr!r}")
    return ("atom", head, *args)


def parse_effect(expr: Any) -> Cond:
    """An effect expression as a nested tuple; cost effects become ``("and",)``."""
    if not isinstance(expr, list) or not expr:
        return ("and",)
    head, args = expr[0], expr[1:]
    if head == "and":
        return ("and", *(parse_effect(a) for a in args))
    if head == "not":
        return ("del", parse_condition(args[0]))
    if head == "when":
        return ("when", parse_condition(args[0]), parse_effect(args[1]))
    if head == "forall":
        return ("forall", tuple(parse_typed_list(args[0])), parse_effect(args[1]))
    if head in ("increase", "decrease", "assign", "scale-up", "scale-down"):
        return ("and",)
    return ("add", parse_condition(expr))


@dataclass(frozen=True)
class ActionSchema:
    """A lifted action: typed parameters, precondition and effect trees."""

    name: str
    parameters: tuple[tuple[str, str], ...]
    precondition: Cond
    effect: Cond


@dataclass(frozen=True)
class Domain:
    name: str
    types: tuple[str, ...]
    actions: dict[str, ActionSchema]


@dataclass(frozen=True)
class Problem:
    name: str
    objects: dict[str, str]  # object -> type
    init: frozenset[Atom]
    goal: Cond


def _sections(tree: list[Any], what: str) -> tuple[str, list[list[Any]]]:
    if len(tree) != 1 or not isinstance(tree[0], list) or tree[0][:1] != ["define"]:
        raise PddlError(f"a PDDL {what} must be one (define ...) form")
    body = tree[0]
    header = body[1] if len(body) > 1 and isinstance(body[1], list) else []
    if header[:1] != [what] or len(header) != 2:
        raise PddlError(f"expected ({what} NAME) after define, got {header!r}")
    return header[1], [s for s in body[2:] if isinstance(s, list) and s]


def parse_domain(text: str) -> Domain:
    """Parse a PDDL domain (types, actions; predicates are not checked)."""
    name, sections = _sections(parse_sexpr(text), "domain")
    types: list[str] = []
    actions: dict[str, ActionSchema] = {}
    for sec in sections:
        if sec[0] == ":types":
            types = [t for t, _ in parse_typed_list(sec[1:])]
        elif sec[0] == ":action":
            fields = dict(zip(sec[2::2], sec[3::2], strict=False))
            actions[sec[1]] = ActionSchema(
                sec[1],
                tuple(parse_typed_list(fields.get(":parameters", []))),
                parse_condition(fields.get(":precondition", [])),
                parse_effect(fields.get(":effect", [])),
            )
    return Domain(name, tuple(types), actions)


def parse_problem(text: str) -> Problem:
    """Parse a PDDL problem (objects, init atoms, goal)."""
    name, sections = _sections(parse_sexpr(text), "problem")
    objects: dict[str, str] = {}
    init: set[Atom] = set()
    goal: Cond = ("and",)
    for sec in sections:
        if sec[0] == ":objects":
            objects.update(parse_typed_list(sec[1:]))
        elif sec[0] == ":init":
            for fact in sec[1:]:
                if not all(isinstance(a, str) for a in fact) or fact[0] in ("=", "not"):
                    continue  # numeric fluents ((= (total-cost) 0)) are not modelled
                init.add(tuple(fact))
        elif sec[0] == ":goal":
            goal = parse_condition(sec[1])
    for fact in init:
        for arg in fact[1:]:
            if arg not in objects:
                raise PddlError(f"init fact {fact!r} uses undeclared object {arg!r}")
    return Problem(name, objects, frozenset(init), goal)


def free_vars(cond: Cond) -> frozenset[str]:
    """Variables (``?x``) that occur free in a condition or effect."""
    kind = cond[0]
    if kind == "atom":
        return frozenset(t for t in cond[2:] if t.startswith("?"))
    if kind == "=":
        return frozenset(t for t in cond[1:] if t.startswith("?"))
    if kind in ("exists", "forall"):
        return free_vars(cond[2]) - {v for v, _ in cond[1]}
    if kind == "when":
        return free_vars(cond[1]) | free_vars(cond[2])
    if kind in ("not", "add", "del"):
        return free_vars(cond[1])
    return frozenset().union(*(free_vars(c) for c in cond[1:]))


class World:
    """A problem's objects over a domain: evaluates conditions and grounds actions in a state."""

    def __init__(self, domain: Domain, problem: Problem) -> None:
        self.domain = domain
        self.problem = problem
        self.by_type: dict[str, list[str]] = {}
        for obj, typ in sorted(problem.objects.items()):
            self.by_type.setdefault(typ, []).append(obj)

    def _term(self, term: str, b: Binding) -> str | None:
        return b.get(term) if term.startswith("?") else term

    def _enumerate(self, names: list[str], b: Binding, vt: dict[str, str]) -> Iterator[Binding]:
        """Every extension of ``b`` binding ``names`` to objects of their declared types."""
        undeclared = [n for n in names if n not in vt]
        if undeclared:
            raise PddlError(
                f"variables {undeclared} are not declared (no parameter or quantifier binds them)"
            )
        domains = [self.by_type.get(vt[n], []) for n in names]
        for values in itertools.product(*domains):
            yield {**b, **dict(zip(names, values, strict=True))}

    def _bind_free(self, cond: Cond, b: Binding, vt: dict[str, str]) -> Iterator[Binding]:
        missing = sorted(v for v in free_vars(cond) if v not in b)
        yield from self._enumerate(missing, b, vt) if missing else iter([b])

    def satisfy(
        self, cond: Cond, state: frozenset[Atom], b: Binding, vt: dict[str, str]
    ) -> Iterator[Binding]:
        """Extensions of ``b`` binding the free variables of ``cond`` under which it holds (may repeat)."""
        kind = cond[0]
        if kind == "atom":
            pred, terms = cond[1], cond[2:]
            vals = [self._term(t, b) for t in terms]
            if all(v is not None for v in vals):
                if (pred, *vals) in state:
                    yield b
                return
            for fact in self._index(state).get(pred, ()):
                if len(fact) != len(terms) + 1:
                    continue
                new = dict(b)
                for term, val, arg in zip(terms, vals, fact[1:], strict=True):
                    if val is None and term not in vt:
                        raise PddlError(f"variable {term!r} of ({pred} ...) is not declared")
                    if val is None:
                        if new.get(term, arg) != arg or self.problem.objects.get(arg) != vt.get(term):
                            break
                        new[term] = arg
                    elif val != arg:
                        break
                else:
                    yield new
        elif kind == "and":
            yield from self._satisfy_all(list(cond[1:]), state, b, vt)
        elif kind == "or":
            seen: set[tuple[tuple[str, str], ...]] = set()
            for sub in cond[1:]:
                for nb in self.satisfy(sub, state, b, vt):
                    for full in self._bind_free(cond, nb, vt):
                        key = tuple(sorted(full.items()))
                        if key not in seen:
                            seen.add(key)
                            yield full
        elif kind in ("not", "=", "forall"):
            for full in self._bind_free(cond, b, vt):
                if self.holds(cond, state, full, vt):
                    yield full
        elif kind == "exists":
            names = {v for v, _ in cond[1]}
            inner = {k: v for k, v in b.items() if k not in names}
            vt2 = {**vt, **dict(cond[1])}
            seen2: set[tuple[tuple[str, str], ...]] = set()
            for nb in self.satisfy(cond[2], state, inner, vt2):
                out = {**b, **{k: v for k, v in nb.items() if k not in names}}
                key = tuple(sorted(out.items()))
                if key not in seen2:
                    seen2.add(key)
                    yield out
        else:
            raise PddlError(f"unsupported condition kind {kind!r}")

    def _satisfy_all(
        self, conds: list[Cond], state: frozenset[Atom], b: Binding, vt: dict[str, str]
    ) -> Iterator[Binding]:
        if not conds:
            yield b
            return

        # Bind from the positive atom with the most bound terms first, then from exists/or;
        # tests that only check (not, =, forall) go last so their variables are bound by then.
        def rank(c: Cond) -> tuple[int, int]:
            if c[0] != "atom":
                return (1 if c[0] in ("exists", "or", "and") else 2, 0)
            return (0, -sum(1 for t in c[2:] if not t.startswith("?") or t in b))

        best = min(range(len(conds)), key=lambda i: rank(conds[i]))
        rest = conds[:best] + conds[best + 1 :]
        for nb in self.satisfy(conds[best], state, b, vt):
            yield from self._satisfy_all(rest, state, nb, vt)

    def holds(self, cond: Cond, state: frozenset[Atom], b: Binding, vt: dict[str, str]) -> bool:
        """Whether ``cond`` holds in ``state`` (free variables must be bound in ``b``)."""
        kind = cond[0]
        if kind == "=":
            return self._term(cond[1], b) == self._term(cond[2], b)
        if kind == "not":
            return not self.holds(cond[1], state, b, vt)
        if kind == "forall":
            vt2 = {**vt, **dict(cond[1])}
            return all(
                self.holds(cond[2], state, nb, vt2) for nb in self._enumerate([v for v, _ in cond[1]], b, vt2)
            )
        return next(iter(self.satisfy(cond, state, b, vt)), None) is not None

    def goal_reached(self, state: frozenset[Atom]) -> bool:
        return self.holds(self.problem.goal, state, {}, {})

    def applicable(self, state: frozenset[Atom]) -> list[tuple[str, tuple[str, ...]]]:
        """Every ground action ``(name, args)`` whose precondition holds, sorted."""
        out: set[tuple[str, tuple[str, ...]]] = set()
        for schema in self.domain.actions.values():
            names = [p for p, _ in schema.parameters]
            vt = dict(schema.parameters)
            for b in self.satisfy(schema.precondition, state, {}, vt):
                for full in self._enumerate([n for n in names if n not in b], b, vt):
                    out.add((schema.name, tuple(full[n] for n in names)))
        return sorted(out)

    def apply(self, state: frozenset[Atom], name: str, args: tuple[str, ...]) -> tuple[set[Atom], set[Atom]]:
        """The (adds, deletes) of ground action ``name(args)`` in ``state``.

        Conditions of ``when`` effects are evaluated in the old state; the new state
        is ``(state - deletes) | adds`` (an atom both added and deleted stays true).
        """
        schema = self.domain.actions[name]
        b = dict(zip((p for p, _ in schema.parameters), args, strict=True))
        adds: set[Atom] = set()
        dels: set[Atom] = set()
        self._effects(schema.effect, state, b, dict(schema.parameters), adds, dels)
        return adds, dels

    def _effects(
        self, eff: Cond, state: frozenset[Atom], b: Binding, vt: dict[str, str], adds: set, dels: set
    ) -> None:
        kind = eff[0]
        if kind == "and":
            for sub in eff[1:]:
                self._effects(sub, state, b, vt, adds, dels)
        elif kind in ("add", "del"):
            atom = eff[1]
            if atom[0] != "atom":
                raise PddlError(f"unsupported effect {eff!r}")
            ground = (atom[1], *(self._term(t, b) or t for t in atom[2:]))
            (adds if kind == "add" else dels).add(ground)
        elif kind == "when":
            if self.holds(eff[1], state, b, vt):
                self._effects(eff[2], state, b, vt, adds, dels)
        elif kind == "forall":
            vt2 = {**vt, **dict(eff[1])}
            for nb in self._enumerate([v for v, _ in eff[1]], b, vt2):
                self._effects(eff[2], state, nb, vt2, adds, dels)
        else:
            raise PddlError(f"unsupported effect kind {kind!r}")

    _index_cache: tuple[frozenset[Atom], dict[str, list[Atom]]] | None = None

    def _index(self, state: frozenset[Atom]) -> dict[str, list[Atom]]:
        """Facts of ``state`` grouped by predicate (cached for the last state seen)."""
        cache = self._index_cache  # one read: safe when threads share this World
        if cache is None or cache[0] is not state:
            idx: dict[str, list[Atom]] = {}
            for fact in sorted(state):
                idx.setdefault(fact[0], []).append(fact)
            cache = (state, idx)
            self._index_cache = cache
        return cache[1]

"""``lookup``: multi-hop question answering over a generated fact base with a ``search`` tool.

Each task has its own small world: ``hops + 1`` layers of entities (person,
company, city, country, region) with short generated names, every entity linked
to one entity of the next layer ("Tamo works at Rile.", "Rile is in Vosa."). The
question follows a chain of ``hops`` links from a person::

    What is the city of the company of Tamo?

``search(query)`` returns the facts that mention the entity ``query`` (as subject
or object) plus ``obs_facts`` distractor facts. The expert searches each hop's
entity in order, then answers.

``names: pool`` draws the entities from :data:`horizonrl.envs.builtin.names.ENTITY_NAMES`
(single tokens of the embedded tokenizer with ``model.tiny_name_tokens``) instead
of random syllables; ``names: code`` names them by three digits whose first one is
the layer (person ``117`` works at company ``242``): the embedded tokenizer splits
every digit, and a tiny model copies digits as reliably as it copies numbers into a
calculator call, where it fails to copy syllable names (as single tokens or not).

``tool_noise = p`` makes the search tool unreliable: with probability ``p`` a
call returns the facts of another entity of the same layer instead (a
distractor result that does not mention the query). The episode's outcome then
depends on randomness *after* a decision, so a good early action can still end
in failure (the downstream contamination of trajectory-level advantages in the
RTPO paper's Eq. 3). The noise is drawn from the environment instance's own RNG
(seeded from Python's global RNG when the instance is made), which is not part
of :meth:`snapshot`: siblings restored from one boundary draw fresh noise. The
expert retries a search whose result did not mention the query.

Tasks may also come from a file (``env.tasks``) with a ``facts`` column: a list of
fact sentences. ``search(query)`` then returns the sentences that mention
``query`` (case-insensitive, whole words); the expert searches the answer's
sentence by its first word and answers.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from horizonrl.envs.builtin.names import ENTITY_NAMES
from horizonrl.envs.core.base import Task, is_file_task
from horizonrl.envs.core.common import ToolEnv, check_bool, check_int, check_noise
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import Tool, ToolCall, format_answer, format_tool_call

LAYER_TYPES = ("person", "company", "city", "country", "region")
NOISE_KINDS = ("guess", "distractor", "redundant")
NAME_KINDS = ("syllable", "pool", "code")
FORK_NOISE_KINDS = ("direct", "redundant", "irrelevant", "guess")
RELATIONS = ("works at", "is in", "is in", "is in")
MAX_HOPS = len(RELATIONS)
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"

SEARCH = Tool(
    "search",
    "Find the facts that mention an entity.",
    {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "entity name"}},
        "required": ["query"],
    },
)


def _names(rng: random.Random, k: int) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < k:
        name = rng.choice(_CONSONANTS) + rng.choice(_VOWELS) + rng.choice(_CONSONANTS) + rng.choice(_VOWELS)
        if name not in seen:
            seen.add(name)
            out.append(name.capitalize())
    return out


def _weighted(rng: random.Random, options: list[tuple[str, float]]) -> str:
    """One name of ``options`` with probability proportional to its weight (one uniform draw)."""
    u = rng.random() * sum(w for _, w in options)
    for name, w in options:
        u -= w
        if u < 0:
            return name
    return options[-1][0]


def _describe(hops: int, person: str) -> str:
    """``the city of the company of Tamo`` for hops=2."""
    text = person
    for i in range(1, hops + 1):
        text = f"the {LAYER_TYPES[i]} of {text}"
    return text


def _fact_text(fact: list[str]) -> str:
    return f"{fact[0]} {fact[1]} {fact[2]}."


@register_env("lookup")
class LookupEnv(ToolEnv):
    """Multi-hop lookup over a generated fact base (see module docstring).

    Knobs: ``hops`` (1-4, default 2) links to follow, or a list of them (each task draws
    one: mixed-difficulty tasks); ``n_entities`` (2-200,
    default 4) entities per layer; ``obs_facts`` (default 0) distractor facts added
    to every search result (long observations when large); ``decompose`` (default
    False) adds a hint that spells out the hops; ``tool_noise`` (default 0) the
    probability of a distractor search result; ``names`` (``syllable`` default, or
    ``pool``) where entity names come from; ``noise_kinds`` the weights of the expert's
    mistakes (see :meth:`expert_action`); ``fork_noise_kinds`` and ``fork_direct`` the
    delegating expert's mistakes and its share of hops searched directly (see
    :meth:`delegation_expert`).
    """

    KNOBS: ClassVar[dict[str, Any]] = {
        "hops": 2,
        "n_entities": 4,
        "obs_facts": 0,
        "decompose": False,
        "tool_noise": 0.0,
        "names": "syllable",
        "noise_kinds": {"guess": 1.0, "distractor": 1.0},
        "fork_noise_kinds": {"direct": 1.0},
        "fork_direct": 0.0,
    }
    qa_style: ClassVar[bool] = True
    task_fields: ClassVar[tuple[str, ...]] = ("facts",)
    system_prompt: ClassVar[str] = (
        f"Answer the question. Look up facts with {SEARCH.example_call()}, "
        "then give the final answer as <answer>...</answer>."
    )

    @property
    def tools(self) -> list[Tool]:
        return [SEARCH]

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        hops = knobs["hops"] if isinstance(knobs["hops"], list) else [knobs["hops"]]
        if not hops:
            raise ValueError(f"{cls.name}: knob 'hops' must be an integer or a non-empty list of them")
        for h in hops:
            check_int(cls.name, "hops", h, 1, MAX_HOPS)
        for knob, allowed in (("noise_kinds", NOISE_KINDS), ("fork_noise_kinds", FORK_NOISE_KINDS)):
            kinds = knobs[knob]
            if (
                not isinstance(kinds, dict)
                or not kinds
                or any(k not in allowed for k in kinds)
                or any(isinstance(w, bool) or not isinstance(w, int | float) or w < 0 for w in kinds.values())
                or not sum(kinds.values()) > 0
            ):
                raise ValueError(
                    f"{cls.name}: knob {knob!r} must map some of {list(allowed)} to non-negative "
                    f"weights (not all 0), got {kinds!r}"
                )
        check_int(cls.name, "n_entities", knobs["n_entities"], 2, 200)
        check_int(cls.name, "obs_facts", knobs["obs_facts"], 0, 10_000)
        check_bool(cls.name, "decompose", knobs["decompose"])
        if knobs["names"] not in NAME_KINDS:
            raise ValueError(f"{cls.name}: knob 'names' must be one of {NAME_KINDS}, got {knobs['names']!r}")
        if knobs["names"] == "code" and knobs["n_entities"] > 100:
            raise ValueError(f"{cls.name}: names=code has 100 codes per layer, fewer than n_entities")
        if knobs["names"] == "pool" and knobs["n_entities"] * (max(hops) + 1) > len(ENTITY_NAMES):
            raise ValueError(
                f"{cls.name}: names=pool has {len(ENTITY_NAMES)} names, fewer than n_entities x (hops + 1)"
            )
        for knob in ("tool_noise", "fork_direct"):
            p = knobs[knob]
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
                raise ValueError(f"{cls.name}: knob {knob!r} must be a number in [0, 1], got {p!r}")

    @classmethod
    def _generate(cls, rng: random.Random, knobs: dict[str, Any]) -> dict[str, Any]:
        hops, m = knobs["hops"], knobs["n_entities"]
        if isinstance(hops, list):
            hops = rng.choice(hops)
        if knobs["names"] == "pool":
            names = rng.sample(ENTITY_NAMES, m * (hops + 1))
        elif knobs["names"] == "code":  # three digits, the first one the layer: 117, 242, ...
            names = [f"{i + 1}{n:02d}" for i in range(hops + 1) for n in rng.sample(range(100), m)]
        else:
            names = _names(rng, m * (hops + 1))
        layers = [names[i * m : (i + 1) * m] for i in range(hops + 1)]
        link: dict[str, str] = {}
        facts: list[list[str]] = []
        for i in range(hops):
            for e in layers[i]:
                link[e] = rng.choice(layers[i + 1])
                facts.append([e, RELATIONS[i], link[e]])
        rng.shuffle(facts)
        chain = [rng.choice(layers[0])]
        for _ in range(hops):
            chain.append(link[chain[-1]])
        prompt = f"What is {_describe(hops, chain[0])}?"
        if knobs["decompose"]:
            steps = [f"the {LAYER_TYPES[1]} of {chain[0]}"] + [
                f"its {LAYER_TYPES[i]}" for i in range(2, hops + 1)
            ]
            prompt += f" Hint: find {', then '.join(steps)}."
        meta = {
            "hops": hops,
            "facts": facts,
            "chain": chain,
            "layers": layers,
            "obs_facts": knobs["obs_facts"],
            "decompose": knobs["decompose"],
        }
        return {"prompt": prompt, "answer": chain[-1], "meta": meta, "key": [facts, chain]}

    def _init_state(self, task: Task) -> dict[str, Any]:
        m = task.meta
        if is_file_task(task):
            facts = m["fields"]["facts"]
            if isinstance(facts, str):
                facts = [facts]
            return {"sentences": [str(f) for f in facts], "searched": [], "chain": [], "layers": []}
        return {
            "facts": [list(f) for f in m["facts"]],
            "chain": list(m["chain"]),
            "layers": [list(layer) for layer in m["layers"]],
            "obs_facts": m["obs_facts"],
            "searched": [],
        }

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        st = self.state
        query = call.arguments["query"].strip().strip(".?!\"'")
        if "sentences" in st:  # a file task: whole-word match in the given sentences
            pattern = re.compile(rf"(?<!\w){re.escape(query)}(?!\w)", re.IGNORECASE)
            hits = [f for f in st["sentences"] if query and pattern.search(f)]
            if query and hits and query.lower() not in st["searched"]:
                st["searched"].append(query.lower())
            return (" ".join(hits) if hits else f'No facts about "{query}".'), False
        entity = next((e for layer in st["layers"] for e in layer if e.lower() == query.lower()), None)
        if entity is None:
            return f'No facts about "{query}".', False
        p = float(self.knobs.get("tool_noise", 0.0))
        if p > 0 and self._noise_rng().random() < p:
            layer = next(layer for layer in st["layers"] if entity in layer)
            others = [e for e in layer if e != entity]
            if others:  # a distractor result: another entity's facts; the query stays unresolved
                entity = self._noise_rng().choice(others)
                return " ".join(_fact_text(f) for f in st["facts"] if entity in (f[0], f[2])), False
        if entity not in st["searched"]:
            st["searched"].append(entity)
        hits = [f for f in st["facts"] if entity in (f[0], f[2])]
        others = [f for f in st["facts"] if entity not in (f[0], f[2])]
        k = min(st["obs_facts"], len(others))
        if k:
            rng = random.Random(f"{st['task_id']}:{entity}:{k}")
            hits = hits + rng.sample(others, k)
            rng.shuffle(hits)
        return " ".join(_fact_text(f) for f in hits), False

    def _noise_rng(self) -> random.Random:
        rng = getattr(self, "_rng", None)
        if rng is None:
            rng = self._rng = random.Random(random.getrandbits(64))
        return rng

    def state_key(self) -> str | None:
        if not self.state:
            return None
        return f"{self.state['task_id']}|searched={','.join(sorted(self.state['searched']))}"

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """Search ``chain[k]`` for the first hop ``k`` not yet searched, then answer.

        With probability ``noise`` per call the expert instead makes a mistake, of a
        kind drawn with the ``noise_kinds`` weights (default guess 1, distractor 1):

        - ``guess``: answers a wrong entity of the answer's type (an early, wrong answer);
        - ``distractor`` (before the last hop): searches another entity of the current
          hop's type (an irrelevant result);
        - ``redundant``: searches an entity it has already searched again (fills the
          context without new evidence; a distractor when nothing was searched yet).
        """
        noise = check_noise(noise)
        st = self.state
        if "sentences" in st:
            return self._file_expert()
        chain, layers = st["chain"], st["layers"]
        hops = len(chain) - 1
        k = 0
        while k < hops and chain[k] in st["searched"]:
            k += 1
        if rng.random() < noise:
            kinds = self.knobs.get("noise_kinds") or {"guess": 1.0, "distractor": 1.0}
            allowed = [(n, float(kinds.get(n, 0))) for n in NOISE_KINDS if kinds.get(n, 0) > 0]
            allowed = [(n, w) for n, w in allowed if n != "distractor" or k < hops]
            kind = "guess" if not allowed else allowed[0][0] if len(allowed) == 1 else _weighted(rng, allowed)
            if kind == "guess":  # also when no declared kind applies (distractor only, at the last hop)
                return format_answer(rng.choice([e for e in layers[hops] if e != chain[hops]]))
            if kind == "redundant" and st["searched"]:
                return format_tool_call("search", {"query": rng.choice(st["searched"])})
            layer = min(k, hops - 1)
            return format_tool_call(
                "search", {"query": rng.choice([e for e in layers[layer] if e != chain[layer]])}
            )
        if k == hops:
            return format_answer(chain[hops])
        return format_tool_call("search", {"query": chain[k]})

    def _file_expert(self) -> str:
        """File task: search the first word of a sentence that mentions the answer, then answer."""
        st = self.state
        answer = st["answer"].lower()
        source = next((f for f in st["sentences"] if answer in f.lower()), None)
        word = source.split()[0].strip(".,;:!?") if source else ""
        if word and word.lower() not in st["searched"]:
            return format_tool_call("search", {"query": word})
        return format_answer(st["answer"])

    @staticmethod
    def subtask(hop: int, entity: str) -> str:
        """The subagent task that resolves one hop (what :meth:`delegation_expert` delegates)."""
        return f"Find the {LAYER_TYPES[hop + 1]} of {entity}."

    def delegation_expert(self, rng: random.Random, noise: float, forks_done: int) -> str:
        """Expert main agent of subagent forking: delegate hop ``k`` to a subagent, then answer.

        Fork call ``k`` delegates :meth:`subtask` for ``chain[k]``; after ``hops`` forks
        it answers. With probability ``noise`` it instead errs, of a kind drawn with the
        ``fork_noise_kinds`` weights (default: ``direct`` only): ``direct`` does the next
        step itself (:meth:`expert_action`, which may also err); ``redundant`` forks the
        right subtask twice; ``irrelevant`` forks it with a subtask about another entity
        of the same layer; ``guess`` answers a wrong entity. So the number of subagents
        (sessions) is the policy's choice, and extra children cost context.

        Knob ``fork_direct`` (default 0) makes searching a hop itself part of the expert's
        own strategy rather than a mistake: the noise-free expert resolves hop ``k`` with a
        direct search instead of a fork with probability ``fork_direct``, drawn per task and hop
        (:meth:`_searches_itself`), so a clean label (the noise-free action on the same
        state) agrees with the action taken and imitation learns both ways to resolve a hop.
        """
        chain = self.state["chain"]
        hops = len(chain) - 1
        if "sentences" in self.state:
            return self.expert_action(rng, noise)
        kinds = self.knobs.get("fork_noise_kinds") or {"direct": 1.0}
        if set(kinds) == {"direct"} and not self.knobs.get("fork_direct"):  # the original expert
            if rng.random() < check_noise(noise):
                return self.expert_action(rng, noise)
            k = forks_done
        else:  # hops resolved so far: delegated (one per fork call) or searched by the main agent
            k = min(hops, forks_done + sum(e in self.state["searched"] for e in chain[:hops]))
            if rng.random() < check_noise(noise):
                options = [(n, float(kinds[n])) for n in FORK_NOISE_KINDS if kinds.get(n, 0) > 0]
                options = [(n, w) for n, w in options if n == "guess" or k < hops]
                kind = options[0][0] if len(options) == 1 else _weighted(rng, options)
                if kind == "guess" or not options:
                    layers = self.state["layers"]
                    return format_answer(rng.choice([e for e in layers[hops] if e != chain[hops]]))
                if kind == "direct":
                    return format_tool_call("search", {"query": chain[k]})
                task = {"task": self.subtask(k, chain[k])}
                if kind == "redundant":
                    return format_tool_call("fork", {"subagents": [task, dict(task)]})
                other = rng.choice([e for e in self.state["layers"][k] if e != chain[k]])
                pair = [task, {"task": self.subtask(k, other)}]
                rng.shuffle(pair)
                return format_tool_call("fork", {"subagents": pair})
        if k < hops:
            if self._searches_itself(chain, k):
                return format_tool_call("search", {"query": chain[k]})
            task = self.subtask(k, chain[k])
            return format_tool_call("fork", {"subagents": [{"task": task}]})
        return format_answer(chain[hops])

    def _searches_itself(self, chain: list[str], k: int) -> bool:
        """Whether the noise-free delegating expert searches hop ``k`` itself (knob ``fork_direct``).

        A fixed draw per task and hop, the same whichever rng or noise asks; it hashes the whole
        chain (answer included), so no prefix of the episode predicts it and imitation learns the
        mixture, not a rule.
        """
        p = float(self.knobs.get("fork_direct") or 0.0)
        return p > 0 and random.Random("fork_direct|" + "|".join(chain) + f"|{k}").random() < p

    def subagent_expert(self, task_text: str, rng: random.Random, noise: float) -> str:
        """Expert subagent for a :meth:`subtask`: search the entity, then answer its link."""
        if "sentences" in self.state:
            return self._file_expert()
        words = task_text.rstrip(".").split()
        entity = words[-1] if words else ""
        link = next((f[2] for f in self.state["facts"] if f[0] == entity), None)
        if entity not in self.state["searched"]:
            return format_tool_call("search", {"query": entity})
        if link is None or rng.random() < check_noise(noise) / 2:
            others = [e for layer in self.state["layers"] for e in layer if e != link]
            return format_answer(rng.choice(others))
        return format_answer(link)

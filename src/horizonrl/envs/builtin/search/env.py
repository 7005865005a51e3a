"""``search``: multi-hop question answering by searching and reading a local corpus (BrowseComp-Plus style).

Tools (Hermes ``<tool_call>`` format, :mod:`horizonrl.envs.core.tools`):

- ``search(query)``: the ``top_k`` best documents, one per line as
  ``1. [d0042] Title`` followed by an indented snippet (the first
  ``snippet_chars`` characters of the text);
- ``open_page(doc_id, offset=0)`` (named ``visit`` with ``page_tool="visit"``):
  the document's text from ``offset``, at most ``max_page_chars`` characters,
  with a note saying which offset continues it; an exact title also works as id;
- ``finish(answer)``: ends the episode with that answer.

The final answer is given with ``finish`` or, as in every :class:`ToolEnv`,
with ``<answer>...</answer>``; either way it scores 1.0 when it matches the gold
answer or one of its aliases after normalization (case, spaces, end
punctuation, a leading article), else 0.0. Tasks come from a question set
(:mod:`.corpus`); the shipped one has 400 questions of 1-4 hops over 296
documents. The retrieval index is read-only state shared by every environment
of the process (:mod:`.index`); an episode's own state (searches, documents
seen and opened, the answer) is in ``self.state``, so the default snapshot is
exact. The scripted expert searches for each gold document's query in hop order,
opens the document, and finishes with the gold answer.

Tasks may also come from a file (``env.tasks``): each row's prompt is asked over
the configured corpus; optional ``gold_docs`` and ``queries`` columns (lists)
give the expert its chain, without them it searches the question once and
finishes with the gold answer.
"""

from __future__ import annotations

import random
import threading
from typing import Any, ClassVar

from horizonrl.envs.builtin.search.corpus import Corpus, Question, load_corpus, load_questions, resolve
from horizonrl.envs.builtin.search.index import RETRIEVERS, IndexSettings, open_index
from horizonrl.envs.core.base import StepResult, Task, is_file_task
from horizonrl.envs.core.common import ToolEnv, check_int, check_noise, generate_tasks
from horizonrl.envs.core.registry import register_env
from horizonrl.envs.core.tools import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    Tool,
    ToolCall,
    error_format_hint,
    format_tool_call,
)
from horizonrl.rewards import normalize_text

PAGE_TOOLS = ("open_page", "visit")

SEARCH = Tool(
    "search",
    "Search the document collection. Returns the best matching documents with their ids, titles and "
    "the start of their text.",
    {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "keywords, e.g. a name"}},
        "required": ["query"],
    },
)
FINISH = Tool(
    "finish",
    "Give the final answer and end the episode.",
    {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the answer only, e.g. a name or year"}},
        "required": ["answer"],
    },
)

_titles_lock = threading.Lock()
_titles: dict[str, dict[str, str]] = {}


def page_tool(name: str) -> Tool:
    """The document-reading tool under ``name`` (``open_page`` or ``visit``)."""
    return Tool(
        name,
        "Read a document by its id from the search results. Long documents are cut; pass the offset "
        "given at the end to read on.",
        {
            "type": "object",
            "properties": {
                "doc_id": {"type": "string", "description": "the document id, e.g. d0042"},
                "offset": {"type": "integer", "description": "character offset to start from (default 0)"},
            },
            "required": ["doc_id"],
        },
    )


def snippet(text: str, limit: int) -> str:
    """The first ``limit`` characters of ``text`` (spaces collapsed), cut at a word, ``...`` if cut."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0] if " " in flat[:limit] else flat[:limit]
    return f"{cut} ..."


def title_map(corpus: Corpus) -> dict[str, str]:
    """Lowercased title -> id of the first document with that title (shared per corpus)."""
    with _titles_lock:
        if corpus.hash not in _titles:
            out: dict[str, str] = {}
            for doc in corpus.documents:
                out.setdefault(doc.title.strip().lower(), doc.id)
            _titles[corpus.hash] = out
        return _titles[corpus.hash]


@register_env("search")
class SearchEnv(ToolEnv):
    """Search and read a local corpus to answer multi-hop questions (see module docstring).

    Knobs: ``corpus`` / ``questions`` (``"builtin"`` or a JSONL path); ``retriever``
    (``bm25`` or ``dense``); ``cache_dir`` (index cache, default
    ``~/.cache/horizonrl/search/<corpus hash>``); ``top_k`` (1-50, default 5)
    results per search; ``snippet_chars`` (0-2000, default 200); ``max_page_chars``
    (100-100000, default 2000) per page read; ``page_tool`` (``open_page`` or
    ``visit``); ``min_hops`` / ``max_hops`` (questions kept; ``max_hops`` None for
    no bound); ``max_steps`` (assistant messages per episode, default 30).
    """

    qa_style: ClassVar[bool] = True
    KNOBS: ClassVar[dict[str, Any]] = {
        "corpus": "builtin",
        "questions": "builtin",
        "retriever": "bm25",
        "cache_dir": None,
        "top_k": 5,
        "snippet_chars": 200,
        "max_page_chars": 2000,
        "page_tool": "open_page",
        "min_hops": 1,
        "max_hops": None,
        "max_steps": 30,
    }
    external_state: ClassVar[bool] = True  # the retrieval index (loaded once per worker)
    system_prompt: ClassVar[str] = (
        "Answer the question by searching a document collection. Search with "
        f"{SEARCH.example_call()}, read a document with "
        f"{page_tool('open_page').example_call()}, and follow the facts from document to document. "
        f"Give the final answer with {FINISH.example_call()} or {ANSWER_OPEN}...{ANSWER_CLOSE}: "
        "only the name, year or word asked for."
    )

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        k = self.knobs
        self._page_tool = page_tool(k["page_tool"])
        self._tools = [SEARCH, self._page_tool, FINISH]
        if k["page_tool"] != "open_page":
            self.system_prompt = type(self).system_prompt.replace('"open_page"', f'"{k["page_tool"]}"')
        self.corpus = load_corpus(k["corpus"])
        self.questions = load_questions(k["questions"], self.corpus)
        self.index = open_index(self.corpus, IndexSettings(retriever=k["retriever"]), k["cache_dir"])

    @property
    def tools(self) -> list[Tool]:
        return self._tools

    @classmethod
    def _check_knobs(cls, knobs: dict[str, Any]) -> None:
        name = cls.name
        for knob in ("corpus", "questions"):
            if not isinstance(knobs[knob], str) or not knobs[knob]:
                raise ValueError(
                    f"{name}: knob {knob!r} must be 'builtin' or a file path, got {knobs[knob]!r}"
                )
            try:
                resolve(knob, knobs[knob])
            except ValueError as e:
                raise ValueError(f"{name}: knob {knob!r}: {e}") from None
        if knobs["retriever"] not in RETRIEVERS:
            raise ValueError(
                f"{name}: knob 'retriever' must be one of {RETRIEVERS}, got {knobs['retriever']!r}"
            )
        if knobs["page_tool"] not in PAGE_TOOLS:
            raise ValueError(
                f"{name}: knob 'page_tool' must be one of {PAGE_TOOLS}, got {knobs['page_tool']!r}"
            )
        if knobs["cache_dir"] is not None and (
            not isinstance(knobs["cache_dir"], str) or not knobs["cache_dir"]
        ):
            raise ValueError(
                f"{name}: knob 'cache_dir' must be a directory path or null, got {knobs['cache_dir']!r}"
            )
        check_int(name, "top_k", knobs["top_k"], 1, 50)
        check_int(name, "snippet_chars", knobs["snippet_chars"], 0, 2000)
        check_int(name, "max_page_chars", knobs["max_page_chars"], 100, 100_000)
        check_int(name, "min_hops", knobs["min_hops"], 1)
        if knobs["max_hops"] is not None:
            check_int(name, "max_hops", knobs["max_hops"], knobs["min_hops"])
        check_int(name, "max_steps", knobs["max_steps"], 1, 10_000)

    # ------------------------------------------------------------------ tasks

    @classmethod
    def _pool(cls, knobs: dict[str, Any]) -> tuple[Corpus, list[Question]]:
        corpus = load_corpus(knobs["corpus"])
        lo, hi = knobs["min_hops"], knobs["max_hops"]
        pool = [
            q
            for q in load_questions(knobs["questions"], corpus)
            if lo <= q.hops and (hi is None or q.hops <= hi)
        ]
        if not pool:
            raise ValueError(f"{cls.name}: no question has between {lo} and {hi} hops; widen the knobs")
        return corpus, pool

    @classmethod
    def make_tasks(cls, n: int, *, seed: int, split: str = "train", **knobs: Any) -> list[Task]:
        full = cls.validate_knobs(knobs)
        corpus, pool = cls._pool(full)
        return generate_tasks(
            cls.name,
            n,
            seed=seed,
            split=split,
            generate=lambda r: cls._candidate(r.choice(pool), corpus, full),
        )

    @classmethod
    def _generate(cls, rng: random.Random, knobs: dict[str, Any]) -> dict[str, Any]:
        corpus, pool = cls._pool(knobs)
        return cls._candidate(rng.choice(pool), corpus, knobs)

    @staticmethod
    def _candidate(q: Question, corpus: Corpus, knobs: dict[str, Any]) -> dict[str, Any]:
        meta = {
            "qid": q.id,
            "hops": q.hops,
            "gold_docs": list(q.gold_docs),
            "queries": list(q.queries) or [corpus.get(d).title for d in q.gold_docs],  # type: ignore[union-attr]
            "corpus": corpus.hash[:16],
            "max_steps": knobs["max_steps"],
        }
        return {
            "prompt": q.question,
            "answer": q.answer,
            "aliases": q.aliases,
            "meta": meta,
            "key": [q.id, q.question],
        }

    # ------------------------------------------------------------------ episode

    def _init_state(self, task: Task) -> dict[str, Any]:
        m = task.meta
        if is_file_task(task):
            fields = m.get("fields", {})
            docs = [str(d) for d in fields.get("gold_docs") or []]
            queries = [str(q) for q in fields.get("queries") or []]
            if len(queries) != len(docs):
                queries = [(self.corpus.get(d).title if self.corpus.get(d) else d) for d in docs]
            return {
                "qid": task.id,
                "gold_docs": docs,
                "queries": queries,
                "searches": [],
                "seen": [],
                "opened": [],
                "final_answer": None,
            }
        if m.get("corpus") != self.corpus.hash[:16]:
            raise ValueError(
                f"task {task.id!r} was made for corpus {m.get('corpus')!r}, but this environment searches "
                f"{self.corpus.hash[:16]!r} ({self.corpus.path})"
            )
        return {
            "qid": m["qid"],
            "gold_docs": list(m["gold_docs"]),
            "queries": list(m["queries"]),
            "searches": [],
            "seen": [],
            "opened": [],
            "final_answer": None,
        }

    def step(self, action: str) -> StepResult:
        was_done = bool(self.state) and self.state["done"]
        result = super().step(action)
        if not was_done and result.done and result.final_answer is None:
            result.final_answer = self.state["final_answer"]  # given with the finish tool
        return result

    def _call_tool(self, call: ToolCall) -> tuple[str, bool]:
        if call.name == SEARCH.name:
            return self._search(call.arguments["query"])
        if call.name == FINISH.name:
            st = self.state
            st["final_answer"] = call.arguments["answer"].strip()
            return ("Correct." if self.finish(st["final_answer"]) else "Incorrect."), False
        return self._open(call.arguments["doc_id"], call.arguments.get("offset", 0))

    def _search(self, query: str) -> tuple[str, bool]:
        st = self.state
        query = " ".join(query.split())
        if not query:
            return f"Error: the search query is empty. {error_format_hint(self.tools, SEARCH.name)}", True
        st["searches"].append(query)
        hits = self.index.search(query, self.knobs["top_k"])
        if not hits:
            return f'No results for "{query}".', False
        lines = []
        for rank, hit in enumerate(hits, 1):
            doc = self.corpus.documents[hit.position]
            if doc.id not in st["seen"]:
                st["seen"].append(doc.id)
            lines.append(f"{rank}. [{doc.id}] {doc.title}")
            if self.knobs["snippet_chars"]:
                lines.append(f"   {snippet(doc.text, self.knobs['snippet_chars'])}")
        return "\n".join(lines), False

    def _open(self, doc_id: str, offset: int | float) -> tuple[str, bool]:
        st = self.state
        key = doc_id.strip().strip("[]")
        doc = self.corpus.get(key)
        if doc is None:
            alt = title_map(self.corpus).get(key.lower())
            doc = self.corpus.get(alt) if alt is not None else None
        if doc is None:
            return (
                f'Error: no document with id "{doc_id}". Use an id from the search results, e.g. d0042.',
                True,
            )
        offset = int(offset)
        if offset < 0 or (offset >= len(doc.text) and offset > 0):
            return f"Error: offset {offset} is outside document {doc.id} ({len(doc.text)} characters).", True
        if doc.id not in st["opened"]:
            st["opened"].append(doc.id)
        cap = self.knobs["max_page_chars"]
        end = min(len(doc.text), offset + cap)
        out = f"[{doc.id}] {doc.title}\n{doc.text[offset:end]}"
        if end < len(doc.text):
            out += (
                f"\n[... {len(doc.text) - end} more characters; call {self._page_tool.name} with "
                f'doc_id "{doc.id}" and offset {end} to read on]'
            )
        return out, False

    def state_key(self) -> str | None:
        if not self.state:
            return None
        return f"{self.state['task_id']}|opened={','.join(sorted(self.state['opened']))}"

    # ------------------------------------------------------------------ expert

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """Follow the hop chain: search each gold document's query, open it; then ``finish``.

        A gold document already returned by an earlier search is opened without
        searching again (one that its own query did not retrieve is opened
        anyway: the expert knows its id). With probability ``noise`` per
        decision the expert instead, 50/50, finishes with a wrong answer (the
        answer of another question) or opens a random non-gold document.
        """
        noise = check_noise(noise)
        st = self.state
        if rng.random() < noise:
            if rng.random() < 0.5:
                return format_tool_call(FINISH.name, {"answer": self._wrong_answer(rng)})
            gold = set(st["gold_docs"])
            doc = rng.choice([d for d in self.corpus.documents if d.id not in gold])
            return format_tool_call(self._page_tool.name, {"doc_id": doc.id})
        for doc_id, query in zip(st["gold_docs"], st["queries"], strict=True):
            if doc_id in st["opened"]:
                continue
            if doc_id in st["seen"] or query in st["searches"]:
                return format_tool_call(self._page_tool.name, {"doc_id": doc_id})
            return format_tool_call(SEARCH.name, {"query": query})
        if not st["gold_docs"] and not st["searches"]:  # a file task without its chain
            return format_tool_call(SEARCH.name, {"query": st["question"]})
        return format_tool_call(FINISH.name, {"answer": st["answer"]})

    def _wrong_answer(self, rng: random.Random) -> str:
        right = {normalize_text(a) for a in self.golds()}
        wrong = sorted({q.answer for q in self.questions if normalize_text(q.answer) not in right})
        return rng.choice(wrong) if wrong else f"not {self.state['answer']}"

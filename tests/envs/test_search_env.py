"""The ``search`` environment: corpus/question loading, BM25 and dense retrieval, the disk cache,
the tools, the expert, snapshots, and the generator of the shipped data."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import multiprocessing
import random
import threading
from pathlib import Path

import numpy as np
import pytest

from horizonrl.envs import get_env, make_env
from horizonrl.envs.builtin.search import SearchEnv, load_corpus, load_questions
from horizonrl.envs.builtin.search.corpus import BUILTIN_FILES
from horizonrl.envs.builtin.search.embed import DIM, embed
from horizonrl.envs.builtin.search.index import (
    BM25Index,
    DenseIndex,
    IndexSettings,
    clear_memory_cache,
    default_cache_dir,
    open_index,
)
from horizonrl.envs.core.tools import format_tool_call
from horizonrl.rewards import normalize_text

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_search_corpus.py"

# A small corpus: a two-hop chain (person -> town -> province), distractors, and topical pages.
DOCS = [
    {
        "id": "p1",
        "title": "Ada Quill",
        "text": "Ada Quill is a painter. Quill was born in Port Venn in 1950.",
    },
    {
        "id": "p2",
        "title": "Ada Morrow",
        "text": "Ada Morrow is a sculptor. Morrow was born in Oldby in 1961.",
    },
    {
        "id": "t1",
        "title": "Port Venn",
        "text": "Port Venn is a harbour town. It lies in the province of Marisk.",
    },
    {"id": "t2", "title": "Oldby", "text": "Oldby is a mill town. It lies in the province of Tarn."},
    {
        "id": "cat",
        "title": "Domestic cat",
        "text": "The cat is a small mammal kept as a household pet. Cats purr.",
    },
    {
        "id": "vol",
        "title": "Volcano",
        "text": "A volcano is a rupture in the crust where lava and ash escape.",
    },
    {
        "id": "bread",
        "title": "Bread",
        "text": "Bread is a staple food baked from a dough of flour and water.",
    },
    {
        "id": "piano",
        "title": "Piano",
        "text": "The piano is a keyboard instrument whose strings hammers strike.",
    },
]
QUESTIONS = [
    {
        "id": f"h2-{i}",
        "question": f"In which province is the town where {who} was born?{' ' * i}",
        "answer": ans,
        "aliases": [f"Province of {ans}"],
        "hops": 2,
        "gold_docs": [p, t],
    }
    for i, (who, p, t, ans) in enumerate(
        [("Ada Quill", "p1", "t1", "Marisk"), ("Ada Morrow", "p2", "t2", "Tarn")] * 3
    )
] + [
    {"id": f"h1-{i}", "question": q, "answer": a, "hops": 1, "gold_docs": [d], "queries": [s]}
    for i, (q, a, d, s) in enumerate(
        [
            ("In what year was Ada Quill born?", "1950", "p1", "Ada Quill"),
            ("What does Ada Morrow do?", "sculptor", "p2", "Ada Morrow painter sculptor"),
            ("In which province does Oldby lie?", "Tarn", "t2", "Oldby"),
            ("In which province does Port Venn lie?", "Marisk", "t1", "Port Venn"),
        ]
    )
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """An index cache folder for the builtin corpus (keeps tests out of ~/.cache)."""
    return str(tmp_path_factory.mktemp("search-cache"))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict[str, str]:
    """Knobs of an environment over the small corpus, with its own cache."""
    d = tmp_path_factory.mktemp("small")
    return {
        "corpus": str(write_jsonl(d / "corpus.jsonl", DOCS)),
        "questions": str(write_jsonl(d / "questions.jsonl", QUESTIONS)),
        "cache_dir": str(d / "cache"),
    }


def run(env, task, rng: random.Random, noise: float = 0.0, max_turns: int = 40):
    env.reset(task)
    out = []
    for _ in range(max_turns):
        action = env.expert_action(rng, noise)
        res = env.step(action)
        out.append((action, res))
        if res.done:
            break
    return out


def all_tasks(env, split: str) -> list:
    """Every task of ``split`` (the small question set splits by content hash)."""
    for n in range(len(QUESTIONS), 0, -1):
        try:
            return env.tasks(n, seed=0, split=split)
        except ValueError:
            continue
    return []


def call(name: str, **args) -> str:
    return format_tool_call(name, args)


# ---------------------------------------------------------------- registry, tools


def test_registered_with_three_tools(cache):
    assert get_env("search") is SearchEnv
    env = make_env("search", cache_dir=cache)
    assert [t.name for t in env.tools] == ["search", "open_page", "finish"]
    assert '"open_page"' in env.system_prompt and "<answer>" in env.system_prompt
    visit = SearchEnv(page_tool="visit", cache_dir=cache)
    assert [t.name for t in visit.tools] == ["search", "visit", "finish"]
    assert '"visit"' in visit.system_prompt and '"open_page"' not in visit.system_prompt
    assert env.index is visit.index  # one shared read-only index per corpus and settings


# ---------------------------------------------------------------- expert


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_builtin_tasks(cache, hops, split):
    env = SearchEnv(min_hops=hops, max_hops=hops, cache_dir=cache)
    for task in env.tasks(4, seed=3, split=split):
        assert task.meta["hops"] == hops and len(task.meta["gold_docs"]) == hops
        steps = run(env, task, random.Random(0))
        last = steps[-1][1]
        assert last.done and last.success and last.reward == 1.0, steps
        assert last.final_answer == task.answer and json.loads(steps[-1][0][11:-12])["name"] == "finish"
        assert sum(r.reward for _, r in steps) == 1.0 and not any(r.invalid for _, r in steps)
        assert len(steps) <= 2 * hops + 1 and all(r.role == "tool" for _, r in steps)
        assert sorted(env.state["opened"]) == sorted(task.meta["gold_docs"])


def test_expert_on_a_custom_corpus(small):
    env = SearchEnv(**small)
    tasks = all_tasks(env, "train") + all_tasks(env, "test")
    assert len(tasks) == len(QUESTIONS)
    for task in tasks:
        assert run(env, task, random.Random(1))[-1][1].success
    # queries default to the gold documents' titles
    two_hop = next(t for t in tasks if t.meta["hops"] == 2)
    assert two_hop.meta["queries"][1] in ("Port Venn", "Oldby")
    # only documents that share a term with the query are results, however large top_k is
    wide = SearchEnv(**small, top_k=50)
    wide.reset(tasks[0])
    assert wide.step(call("search", query="Marisk province")).observation.split("\n")[::2] == [
        "1. [t1] Port Venn",
        "2. [t2] Oldby",
    ]


def test_noisy_expert_is_worse_and_deterministic(cache):
    env = SearchEnv(cache_dir=cache)
    tasks = env.tasks(30, seed=5)
    solved = sum(run(env, t, random.Random(i), noise=0.5)[-1][1].success for i, t in enumerate(tasks))
    assert solved < 30
    assert not any(run(env, t, random.Random(i), noise=1.0)[-1][1].success for i, t in enumerate(tasks[:8]))
    for i, t in enumerate(tasks[:4]):
        a = [(x, dataclasses.asdict(r)) for x, r in run(env, t, random.Random(i), noise=0.5)]
        b = [(x, dataclasses.asdict(r)) for x, r in run(env, t, random.Random(i), noise=0.5)]
        assert a == b
    with pytest.raises(ValueError, match="noise"):
        env.expert_action(random.Random(0), noise=2)


# ---------------------------------------------------------------- answers


def test_answers_by_tag_or_finish_with_aliases(cache):
    env = SearchEnv(cache_dir=cache)
    task = next(t for t in env.tasks(40, seed=0) if t.aliases)
    env.reset(task)
    res = env.step(f"I found it. <answer> The {task.aliases[0].upper()}. </answer>")
    assert res.done and res.success and res.reward == 1.0 and res.role == "user"
    assert res.final_answer == f"The {task.aliases[0].upper()}."
    env.reset(task)
    res = env.step(call("finish", answer=f" {task.answer.lower()} "))
    assert res.done and res.success and res.reward == 1.0 and res.role == "tool"
    assert res.final_answer == task.answer.lower() and res.observation == "Correct."
    again = env.step(call("finish", answer=task.answer))
    assert again.invalid and again.reward == 0.0 and again.observation == "The episode is over."
    env.reset(task)
    res = env.step(call("search", query=task.answer) + call("finish", answer="Nobody at all"))
    assert res.done and not res.success and res.reward == 0.0 and res.final_answer == "Nobody at all"
    assert res.tool_calls == 2 and res.observation.endswith("Incorrect.")


def test_max_steps_ends_the_episode(cache):
    env = SearchEnv(max_steps=2, cache_dir=cache)
    env.reset(env.tasks(1, seed=0)[0])
    assert not env.step(call("search", query="harbor")).done
    res = env.step(call("search", query="tower"))
    assert res.done and not res.success and res.reward == 0.0 and "Out of steps." in res.observation


# ---------------------------------------------------------------- tools


def test_search_results_and_snippets(cache):
    env = SearchEnv(cache_dir=cache, top_k=3, snippet_chars=40)
    corpus = env.corpus
    task = env.tasks(1, seed=0)[0]
    env.reset(task)
    doc = corpus.get(task.meta["gold_docs"][0])
    res = env.step(call("search", query=f"  {doc.title.lower()}  "))
    lines = res.observation.split("\n")
    assert not res.invalid and len(lines) in (2, 4, 6) and lines[0] == f"1. [{doc.id}] {doc.title}"
    assert lines[1].startswith("   ") and len(lines[1]) <= 3 + 40 + 4
    assert doc.text.startswith(lines[1].strip().removesuffix(" ..."))
    assert env.state["searches"] == [doc.title.lower()] and doc.id in env.state["seen"]
    assert env.step(call("search", query="the of and")).observation == 'No results for "the of and".'
    empty = env.step(call("search", query="   "))
    assert empty.invalid and empty.observation.startswith("Error: the search query is empty.")
    bare = SearchEnv(cache_dir=cache, snippet_chars=0, top_k=7)
    bare.reset(task)
    common = bare.step(call("search", query="city population")).observation.split("\n")
    assert [line.split(" ")[0] for line in common] == [f"{i}." for i in range(1, 8)]
    assert len(env.step(call("search", query="city population")).observation.split("\n")) == 6


def test_every_title_retrieves_its_document_first(cache):
    corpus = load_corpus()
    index = open_index(corpus, IndexSettings(), cache)
    misses = [d.title for i, d in enumerate(corpus.documents) if index.search(d.title, 1)[0].position != i]
    assert misses == []


def test_open_page_caps_and_continues(cache):
    env = SearchEnv(cache_dir=cache, max_page_chars=100)
    env.reset(env.tasks(1, seed=0)[0])
    doc = max(env.corpus.documents, key=lambda d: len(d.text))
    assert len(doc.text) > 200
    first = env.step(call("open_page", doc_id=doc.id))
    head, body = first.observation.split("\n", 1)
    assert head == f"[{doc.id}] {doc.title}" and body.startswith(doc.text[:100] + "\n[... ")
    assert f'doc_id "{doc.id}" and offset 100' in body and f"{len(doc.text) - 100} more characters" in body
    nxt = env.step(call("open_page", doc_id=doc.id, offset=100))
    assert nxt.observation.split("\n")[1] == doc.text[100:200]
    assert env.state["opened"] == [doc.id] and nxt.obs_key.endswith(f"opened={doc.id}")
    by_title = env.step(call("open_page", doc_id=doc.title.upper()))
    assert by_title.observation.startswith(f"[{doc.id}] ") and not by_title.invalid
    for bad, msg in [
        ({"doc_id": "nope"}, 'no document with id "nope"'),
        ({"doc_id": doc.id, "offset": -1}, "offset -1"),
    ]:
        res = env.step(call("open_page", **bad))
        assert (
            res.invalid and not res.done and res.observation.startswith("Error: ") and msg in res.observation
        )
    past = env.step(call("open_page", doc_id=doc.id, offset=len(doc.text)))
    assert past.invalid and f"({len(doc.text)} characters)" in past.observation


@pytest.mark.parametrize(
    ("action", "expect"),
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "browse", "arguments": {}}</tool_call>', 'unknown tool "browse"'),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', 'missing required argument "query"'),
        ('<tool_call>{"name": "open_page", "arguments": {"doc_id": 7}}</tool_call>', '"doc_id" of open_page'),
        ('<tool_call>{"name": "finish", "arguments": {"answer": 1}}</tool_call>', '"answer" of finish'),
        ("I think the answer is Marisk.", "No tool call or answer found."),
    ],
)
def test_malformed_actions_give_error_observations(cache, action, expect):
    env = SearchEnv(cache_dir=cache)
    env.reset(env.tasks(1, seed=0)[0])
    before = env.snapshot()
    res = env.step(action)
    assert res.invalid and not res.done and res.reward == 0.0 and expect in res.observation
    assert res.role == ("user" if "No tool call" in expect else "tool")
    after = env.snapshot()
    assert after.pop("turn") == before.pop("turn") + 1 and after == before


# ---------------------------------------------------------------- snapshot / restore


def test_snapshot_restore_replay_is_exact(cache):
    env = SearchEnv(cache_dir=cache)
    for i, task in enumerate(env.tasks(4, seed=2, split="test")):
        env.reset(task)
        rng = random.Random(i)
        snaps, actions, results = [env.snapshot()], [], []
        for _ in range(20):
            actions.append(env.expert_action(rng, noise=0.3))
            results.append(env.step(actions[-1]))
            snaps.append(env.snapshot())
            if results[-1].done:
                break
        for t in range(len(actions)):
            env.restore(snaps[t])
            env.step(call("search", query="diverge here"))
            env.step(call("open_page", doc_id=env.corpus.documents[0].id))
            env.restore(snaps[t])
            replay = [env.step(a) for a in actions[t:]]
            assert [dataclasses.asdict(r) for r in replay] == [dataclasses.asdict(r) for r in results[t:]]
            assert env.snapshot() == snaps[-1]


# ---------------------------------------------------------------- tasks and knobs


def test_make_tasks_deterministic_split_disjoint_and_filtered(cache):
    a = SearchEnv.make_tasks(60, seed=7)
    assert [dataclasses.asdict(t) for t in a] == [
        dataclasses.asdict(t) for t in SearchEnv.make_tasks(60, seed=7)
    ]
    assert [t.id for t in SearchEnv.make_tasks(60, seed=8)] != [t.id for t in a]
    test = SearchEnv.make_tasks(60, seed=7, split="test")
    assert not {t.meta["qid"] for t in a} & {t.meta["qid"] for t in test}
    assert len({t.meta["qid"] for t in a}) == 60 and all(t.meta["split"] == "test" for t in test)
    questions = {q["id"]: q for q in map(json.loads, BUILTIN_FILES["questions"].read_text().splitlines())}
    for t in a:
        q = questions[t.meta["qid"]]
        assert (t.prompt, t.answer, list(t.aliases), t.meta["gold_docs"]) == (
            q["question"],
            q["answer"],
            q["aliases"],
            q["gold_docs"],
        )
        json.dumps(dataclasses.asdict(t))
    assert {t.meta["hops"] for t in SearchEnv.make_tasks(20, seed=0, min_hops=3)} == {3, 4}
    with pytest.raises(ValueError, match="widen the knobs"):
        SearchEnv.make_tasks(101, seed=0, min_hops=2, max_hops=2)


def test_reset_rejects_tasks_of_another_corpus(cache, small):
    builtin_task = SearchEnv.make_tasks(1, seed=0)[0]
    with pytest.raises(ValueError, match="was made for corpus"):
        SearchEnv(**small).reset(builtin_task)
    with pytest.raises(ValueError, match="not 'search'"):
        SearchEnv(cache_dir=cache).reset(get_env("lookup").make_tasks(1, seed=0)[0])


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("retriever", "tfidf"),
        ("top_k", 0),
        ("top_k", 51),
        ("snippet_chars", -1),
        ("max_page_chars", 50),
        ("page_tool", "read"),
        ("min_hops", 0),
        ("max_hops", 0),
        ("max_steps", 0),
        ("corpus", "/no/such/corpus.jsonl"),
        ("questions", ""),
        ("cache_dir", 3),
        ("colour", 1),
    ],
)
def test_knob_validation_names_the_knob(knob, value):
    with pytest.raises(ValueError, match=f"'{knob}'") as e:
        SearchEnv(**{knob: value})
    assert "search" in str(e.value)
    with pytest.raises(ValueError, match=f"'{knob}'"):
        SearchEnv.make_tasks(1, seed=0, **{knob: value})


# ---------------------------------------------------------------- corpus and question files


@pytest.mark.parametrize(
    ("lines", "expect"),
    [
        (['{"id": "a", "title": "A", "text": "x"}', "{oops"], r"corpus.jsonl:2: not valid JSON"),
        (['{"id": "a", "title": "A"}'], r":1: field 'text' must be str, got None"),
        (['{"id": true, "title": "A", "text": "x"}'], r":1: field 'id' must be str or int"),
        (['{"id": "a", "title": "A", "text": "x"}', '{"id": "a", "title": "B", "text": "y"}'], "duplicate"),
        (["[1, 2]"], "expected a JSON object, got list"),
        (["", "  "], "the corpus has no documents"),
    ],
)
def test_bad_corpus_files_name_the_line(tmp_path, lines, expect):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=expect):
        load_corpus(str(path))


def test_bad_question_files(tmp_path, small):
    corpus = load_corpus(small["corpus"])
    cases = [
        ({"id": "q", "question": "?", "answer": "a", "gold_docs": ["zz"]}, "cites gold document 'zz'"),
        ({"id": "q", "question": "?", "answer": "a", "gold_docs": ["p1"], "queries": []}, ""),
        (
            {"id": "q", "question": "?", "answer": "a", "gold_docs": ["p1"], "queries": ["a", "b"]},
            "'queries' has 2",
        ),
        ({"id": "q", "question": "?", "answer": "a", "hops": 0}, "'hops' must be a positive integer"),
        ({"id": "q", "question": "?", "answer": "a", "aliases": "x"}, "'aliases' must be a list"),
        ({"id": "q", "answer": "a"}, "field 'question' must be str"),
    ]
    for i, (row, expect) in enumerate(cases):
        path = write_jsonl(tmp_path / f"q{i}.jsonl", [row])
        if not expect:
            (q,) = load_questions(str(path), corpus)
            assert (q.hops, q.gold_docs, q.aliases) == (1, ("p1",), ())
            continue
        with pytest.raises(ValueError, match=expect):
            load_questions(str(path), corpus)


# ---------------------------------------------------------------- retrieval and the index cache


def test_bm25_scores_match_the_lucene_formula(tmp_path):
    rows = [
        {"id": 1, "title": "alpha", "text": "alpha beta"},
        {"id": 2, "title": "beta", "text": "gamma delta gamma"},
        {"id": 3, "title": "gamma", "text": "epsilon"},
    ]
    corpus = load_corpus(str(write_jsonl(tmp_path / "c.jsonl", rows)))
    settings = IndexSettings(k1=1.2, b=0.6)
    hits = open_index(corpus, settings, tmp_path / "cache").search("Gamma, zeta!", 10)
    # tokens of title + text: [alpha alpha beta], [beta gamma delta gamma], [gamma epsilon]; "zeta" is unknown
    lengths, tf, avg, n, df = {1: 4, 2: 2}, {1: 2, 2: 1}, 3.0, 3, 2
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    want = {
        p: idf * tf[p] / (tf[p] + settings.k1 * (1 - settings.b + settings.b * lengths[p] / avg)) for p in tf
    }
    assert [h.position for h in hits] == [1, 2]
    assert [h.score for h in hits] == pytest.approx([want[1], want[2]], rel=1e-5)


def test_index_is_cached_on_disk_and_rebuilt_when_stale(small, monkeypatch):
    corpus = load_corpus(small["corpus"])
    root = Path(small["cache_dir"])
    index = open_index(corpus, IndexSettings(), root)
    folder = root / f"bm25-{IndexSettings().key(corpus.hash)}"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["corpus_hash"] == corpus.hash and manifest["n_docs"] == len(DOCS)
    assert open_index(corpus, IndexSettings(), root) is index  # memory cache
    assert IndexSettings(k1=1.0).key(corpus.hash) != IndexSettings().key(corpus.hash)
    assert IndexSettings(model="all-MiniLM-L6-v2").key("h") == IndexSettings().key("h")  # not a bm25 setting
    clear_memory_cache()

    def no_build(*a, **k):
        raise AssertionError("should have been loaded from disk")

    monkeypatch.setattr(BM25Index, "build", classmethod(no_build))
    loaded = open_index(corpus, IndexSettings(), root)
    assert loaded is not index and [h.position for h in loaded.search("Ada Quill", 2)] == [0, 1]
    monkeypatch.undo()
    (folder / "vocab.index.json").write_text("{broken")
    clear_memory_cache()
    rebuilt = open_index(corpus, IndexSettings(), root)
    assert [h.position for h in rebuilt.search("Ada Quill", 2)] == [0, 1]
    assert json.loads((folder / "vocab.index.json").read_text())  # rewritten
    builds = []
    monkeypatch.setattr(BM25Index, "build", classmethod(lambda cls, c, st: builds.append(1) or rebuilt))
    (folder / "manifest.json").write_text(json.dumps({**manifest, "n_docs": 99}))  # another corpus's index
    clear_memory_cache()
    assert open_index(corpus, IndexSettings(), root) is rebuilt and builds == [1]
    assert json.loads((folder / "manifest.json").read_text()) == manifest
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_default_cache_dir_and_env_use_it(small, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir("ab" * 32) == tmp_path / "xdg" / "horizonrl" / "search" / ("ab" * 8)
    env = SearchEnv(corpus=small["corpus"], questions=small["questions"])
    folder = default_cache_dir(env.corpus.hash)
    assert [p.name for p in folder.iterdir()] == [f"bm25-{IndexSettings().key(env.corpus.hash)}"]
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir("cd" * 32) == tmp_path / "home" / ".cache" / "horizonrl" / "search" / ("cd" * 8)


def test_no_leaked_threads_processes_or_temp_dirs(small):
    threads = threading.active_count()
    env = SearchEnv(**small)
    for task in all_tasks(env, "train")[:3]:
        run(env, task, random.Random(0), noise=0.3)
    env.close()
    assert threading.active_count() == threads and multiprocessing.active_children() == []
    assert not [p for p in Path(small["cache_dir"]).rglob(".*")]


def test_dense_retrieval_embeddings_and_cache(small, monkeypatch):
    vecs = embed(
        ["The cat is a household pet that purrs.", "a small feline pet", "Lava erupts from a volcano."]
    )
    assert vecs.shape == (3, DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[1] @ vecs[0] > vecs[1] @ vecs[2] + 0.2
    # batched in length order, scattered back: the same vector as embedding the text alone
    assert np.allclose(embed(["a small feline pet"])[0], vecs[1], atol=1e-5) and embed([]).shape == (0, DIM)
    env = SearchEnv(**small, retriever="dense", top_k=2)
    positions = {d["id"]: i for i, d in enumerate(DOCS)}
    for query, doc in [
        ("a feline animal that purrs", "cat"),
        ("molten rock coming out of a mountain", "vol"),
        ("baked loaf made of flour", "bread"),
        ("musical instrument with keys", "piano"),
    ]:
        assert env.index.search(query, 1)[0].position == positions[doc], query
    task = next(t for t in all_tasks(env, "train") if t.meta["hops"] == 2)
    steps = run(env, task, random.Random(0))
    assert steps[-1][1].success and len(steps) == 5
    assert steps[0][1].observation.startswith(f"1. [{task.meta['gold_docs'][0]}] ")
    clear_memory_cache()

    def no_build(*a, **k):
        raise AssertionError("should have been loaded from disk")

    monkeypatch.setattr(DenseIndex, "build", classmethod(no_build))
    again = SearchEnv(**small, retriever="dense")
    assert isinstance(again.index, DenseIndex) and again.index is not env.index
    assert again.index.index.ntotal == len(DOCS)
    stored = again.index.index.reconstruct_n(0, len(DOCS))
    assert np.array_equal(stored, env.index.index.reconstruct_n(0, len(DOCS)))
    assert np.allclose(
        stored[positions["cat"]], embed([f"{DOCS[4]['title']}\n{DOCS[4]['text']}"])[0], atol=1e-5
    )


# ---------------------------------------------------------------- the shipped data and its generator


def test_generator_reproduces_the_shipped_files(tmp_path):
    spec = importlib.util.spec_from_file_location("make_search_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "make_search_corpus.py" in module.__doc__
    assert module.main(["--out", str(tmp_path)]) == 0
    for name in ("corpus.jsonl", "questions.jsonl"):
        assert (tmp_path / name).read_bytes() == BUILTIN_FILES[name.split(".")[0]].read_bytes(), name


def test_shipped_questions_follow_their_chains():
    docs = {d["id"]: d for d in map(json.loads, BUILTIN_FILES["corpus"].read_text().splitlines())}
    questions = [json.loads(line) for line in BUILTIN_FILES["questions"].read_text().splitlines()]
    assert len(docs) == 296 and len(questions) == 400 and len({q["question"] for q in questions}) == 400
    assert sorted(q["hops"] for q in questions) == sorted([1, 2, 3, 4] * 100)
    for q in questions:
        assert len(q["gold_docs"]) == len(q["queries"]) == len(q["relations"]) == q["hops"]
        assert normalize_text(q["answer"]) not in normalize_text(q["question"])
        assert q["queries"][0].strip('"') in q["question"] or f'"{q["queries"][0]}"' in q["question"]
        for i, doc_id in enumerate(q["gold_docs"]):
            assert docs[doc_id]["title"] == q["queries"][i]
            following = q["queries"][i + 1] if i + 1 < q["hops"] else q["answer"]
            assert following in docs[doc_id]["text"], (q["id"], i)
    person_answers = [q for q in questions if q["relations"][-1] in ("founder", "mayor", "creator")]
    assert person_answers and all(len(q["aliases"]) == 1 for q in person_answers)

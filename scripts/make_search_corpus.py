"""Generate the shipped multi-hop QA corpus and question set of the ``search`` environment.

Run from the repository root (deterministic: the same files every time)::

    .venv/bin/python scripts/make_search_corpus.py            # writes src/horizonrl/envs/builtin/search/data/
    .venv/bin/python scripts/make_search_corpus.py --out DIR  # somewhere else

The world is invented (names are made of syllables, so a model cannot answer from
memory): countries, cities, companies, universities, people and creative works,
linked by functional relations (a person's birthplace, employer and university;
a company's founder and headquarters; a city's country and mayor; a country's
capital; a work's creator and publisher) and literal attributes (years,
occupation, language, currency). Every entity has one wiki-style page that
states its relations and attributes; distractor pages (fairs, festivals,
conferences) mention many entities without stating any relation, and shared
first names and surnames make name searches ambiguous.

A question of ``h`` hops (1-4) follows ``h`` relations from a start entity named
in the question, the last of which may be an attribute::

    In which country does the city where the founder of Kavo Systems was born lie?

Its gold documents are the pages of the ``h`` entities whose pages state those
relations, in hop order (the start entity's page first); ``queries`` are their
titles (what the scripted expert searches for); ``aliases`` are other accepted
forms of the answer.

Outputs: ``corpus.jsonl`` (``id``, ``title``, ``text``) and ``questions.jsonl``
(``id``, ``question``, ``answer``, ``aliases``, ``hops``, ``gold_docs``,
``queries``, ``relations``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

SEED = 20240607
COUNTS = {"country": 8, "city": 28, "company": 30, "university": 10, "person": 120, "work": 40}
N_EVENTS = 60
QUESTIONS_PER_HOP = 100
MAX_HOPS = 4
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src/horizonrl/envs/builtin/search/data"

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "sk")
OCCUPATIONS = (
    "architect", "chemist", "engineer", "novelist", "economist", "physician", "sculptor", "lawyer",
    "botanist", "composer", "journalist", "historian", "photographer", "geologist", "diplomat",
)  # fmt: skip
INDUSTRIES = ("software", "shipping", "textile", "mining", "pharmaceutical", "aerospace", "food", "energy")
SUFFIXES = ("Systems", "Works", "Labs", "Group", "Holdings", "Industries", "Dynamics", "Partners")
UNIVERSITY_FORMS = ("{} University", "{} Institute of Technology", "University of {}", "{} College")
COUNTRY_FORMS = ("Republic of {}", "Kingdom of {}", "Federation of {}", "Commonwealth of {}")
ADJECTIVES = (
    "Amber", "Silent", "Crimson", "Hollow", "Distant", "Frozen", "Golden", "Broken", "Quiet", "Iron",
    "Velvet", "Hidden", "Burning", "Northern", "Pale", "Restless", "Sunken", "Wandering", "Bitter", "Last",
)  # fmt: skip
NOUNS = (
    "Orchard", "Harbor", "Lantern", "Meridian", "Garden", "Tide", "Engine", "Cathedral", "Archive",
    "Frontier", "Mirror", "Compass", "Winter", "River", "Tower", "Season", "Letter", "Island", "Signal",
)  # fmt: skip
WORK_KINDS = {
    "novel": ("wrote", "written"),
    "film": ("directed", "directed"),
    "album": ("recorded", "recorded"),
}
HOBBIES = ("chess", "sailing", "beekeeping", "astronomy", "rowing", "calligraphy", "birdwatching", "cooking")
LANDMARKS = ("old harbor", "covered market", "clock tower", "botanical garden", "stone bridge", "opera house")
EVENT_KINDS = ("Trade Fair", "Book Festival", "Science Conference", "Film Week", "Design Biennale", "Summit")

# relation -> (subject type, object type, phrase nesting a description, question about a description)
RELATIONS: dict[str, tuple[str, str, str, str]] = {
    "birthplace": ("person", "city", "the city where {} was born", "In which city was {} born?"),
    "employer": ("person", "company", "the company that employs {}", "Which company employs {}?"),
    "alma_mater": (
        "person",
        "university",
        "the university where {} studied",
        "At which university did {} study?",
    ),
    "headquarters": (
        "company",
        "city",
        "the city where {} has its headquarters",
        "In which city does {} have its headquarters?",
    ),
    "campus": ("university", "city", "the city where {} is located", "In which city is {} located?"),
    "founder": ("company", "person", "the founder of {}", "Who founded {}?"),
    "country": ("city", "country", "the country in which {} lies", "In which country does {} lie?"),
    "mayor": ("city", "person", "the mayor of {}", "Who is the mayor of {}?"),
    "capital": ("country", "city", "the capital of {}", "What is the capital of {}?"),
    "creator": ("work", "person", "the creator of {}", "Who created {}?"),
    "publisher": ("work", "company", "the company that released {}", "Which company released {}?"),
}
# attribute -> (subject type, question about a description)
ATTRIBUTES: dict[str, tuple[str, str]] = {
    "birth_year": ("person", "In what year was {} born?"),
    "occupation": ("person", "What is the occupation of {}?"),
    "founded": ("company", "In what year was {} founded?"),
    "established": ("university", "In what year was {} established?"),
    "city_founded": ("city", "In what year was {} founded?"),
    "language": ("country", "What is the official language of {}?"),
    "currency": ("country", "What is the currency of {}?"),
    "year": ("work", "In what year was {} released?"),
}


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def _unique_words(rng: random.Random, n: int, used: set[str], syllables: tuple[int, ...]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, rng.choice(syllables))
        if w not in used and len(w) >= 4:
            used.add(w)
            out.append(w)
    return out


def build_world(rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """Entities of every type with their relations and attributes (names unique across the world)."""
    used: set[str] = set()
    w: dict[str, list[dict[str, Any]]] = {}
    w["country"] = [
        {"name": n + rng.choice(("ia", "ora", "and", "esh")), "form": rng.choice(COUNTRY_FORMS)}
        for n in _unique_words(rng, COUNTS["country"], used, (2,))
    ]
    languages = _unique_words(rng, COUNTS["country"], used, (2,))
    currencies = _unique_words(rng, COUNTS["country"], used, (1, 2))
    for c, lang, cur in zip(w["country"], languages, currencies, strict=True):
        c["language"], c["currency"] = lang + "ic", cur.lower()
    w["city"] = [
        {"name": n, "city_founded": rng.randint(800, 1850), "population": rng.randint(20, 900) * 1000}
        for n in _unique_words(rng, COUNTS["city"], used, (2, 3))
    ]
    for i, city in enumerate(w["city"]):
        city["country"] = i if i < COUNTS["country"] else rng.randrange(COUNTS["country"])
    for ci, country in enumerate(w["country"]):
        country["capital"] = rng.choice([i for i, c in enumerate(w["city"]) if c["country"] == ci])
    firsts = _unique_words(rng, 40, used, (2,))
    lasts = _unique_words(rng, 45, used, (2, 3))
    middles = _unique_words(rng, 30, used, (1, 2))
    names: set[str] = set()
    w["person"] = []
    while len(w["person"]) < COUNTS["person"]:
        first, last = rng.choice(firsts), rng.choice(lasts)
        if f"{first} {last}" in names:
            continue
        names.add(f"{first} {last}")
        w["person"].append(
            {
                "name": f"{first} {last}",
                "full": f"{first} {rng.choice(middles)} {last}",
                "last": last,
                "birth_year": rng.randint(1930, 1995),
                "occupation": rng.choice(OCCUPATIONS),
                "birthplace": rng.randrange(COUNTS["city"]),
                "hobby": rng.choice(HOBBIES),
            }
        )
    founders = rng.sample(range(COUNTS["person"]), COUNTS["company"])
    w["company"] = []
    for word, founder in zip(_unique_words(rng, COUNTS["company"], used, (2,)), founders, strict=True):
        year = min(2020, w["person"][founder]["birth_year"] + rng.randint(22, 45))
        w["company"].append(
            {
                "name": f"{word} {rng.choice(SUFFIXES)}",
                "word": word,
                "founder": founder,
                "founded": year,
                "headquarters": rng.randrange(COUNTS["city"]),
                "industry": rng.choice(INDUSTRIES),
                "staff": rng.randint(2, 400) * 50,
            }
        )
    w["university"] = [
        {
            "name": rng.choice(UNIVERSITY_FORMS).format(word),
            "established": rng.randint(1700, 1960),
            "campus": rng.randrange(COUNTS["city"]),
            "students": rng.randint(20, 400) * 100,
        }
        for word in _unique_words(rng, COUNTS["university"], used, (2, 3))
    ]
    mayors = rng.sample([i for i in range(COUNTS["person"]) if i not in founders], COUNTS["city"])
    for city, mayor in zip(w["city"], mayors, strict=True):
        city["mayor"] = mayor
    for i, p in enumerate(w["person"]):
        p["employer"] = founders.index(i) if i in founders else rng.randrange(COUNTS["company"])
        p["alma_mater"] = rng.randrange(COUNTS["university"])
    titles: set[str] = set()
    w["work"] = []
    while len(w["work"]) < COUNTS["work"]:
        title = f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        if title in titles:
            continue
        titles.add(title)
        creator = rng.randrange(COUNTS["person"])
        w["work"].append(
            {
                "name": title,
                "kind": rng.choice(sorted(WORK_KINDS)),
                "creator": creator,
                "year": min(2023, w["person"][creator]["birth_year"] + rng.randint(20, 50)),
                "publisher": rng.randrange(COUNTS["company"]),
            }
        )
    return w


def aliases(kind: str, e: dict[str, Any]) -> list[str]:
    """Other accepted forms of an entity's name as an answer."""
    if kind == "person":
        return [e["full"]]
    if kind == "company":
        return [f"{e['name']} Ltd", e["word"]]
    if kind == "country":
        return [e["form"].format(e["name"])]
    return []


def _a(word: str) -> str:
    """``a chemist``, ``an architect``."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _mention(kind: str, e: dict[str, Any]) -> str:
    return f'"{e["name"]}"' if kind == "work" else e["name"]


def _page(kind: str, e: dict[str, Any], w: dict[str, list[dict[str, Any]]], rng: random.Random) -> str:
    """The text of an entity's page: a lead sentence, then its facts in a shuffled order."""
    n = e["name"]
    city = w["city"]
    if kind == "person":
        short = e["last"]
        lead = f"{e['full']}, usually called {n}, is {_a(e['occupation'])}."
        facts = [
            f"{short} was born in {city[e['birthplace']]['name']} in {e['birth_year']}.",
            f"{short} studied at {w['university'][e['alma_mater']]['name']}.",
            f"{short} works for {w['company'][e['employer']]['name']}.",
            f"Outside of work, {short} is known for an interest in {e['hobby']}.",
        ]
        i = e["i"]
        founded = [c for c in w["company"] if c["founder"] == i]
        facts += [f"In {c['founded']}, {short} founded {c['name']}." for c in founded]
        for c in (c for c in city if c["mayor"] == i):
            facts.append(f"{short} has served as mayor of {c['name']} since {rng.randint(2005, 2022)}.")
        for x in (x for x in w["work"] if x["creator"] == i):
            facts.append(f'{short} {WORK_KINDS[x["kind"]][0]} the {x["kind"]} "{x["name"]}".')
    elif kind == "city":
        country = w["country"][e["country"]]
        capital = country["capital"] == e["i"]
        lead = f"{n} is a city with a population of about {e['population']:,}."
        facts = [
            f"{n} lies in {country['name']}" + (", of which it is the capital." if capital else "."),
            f"{n} was founded in {e['city_founded']}.",
            f"The current mayor of {n} is {w['person'][e['mayor']]['name']}.",
            f"The city is known for its {rng.choice(LANDMARKS)}.",
        ]
    elif kind == "country":
        lead = f"{n}, officially the {e['form'].format(n)}, is a sovereign state."
        cities = [c["name"] for c in city if w["country"][c["country"]] is e]
        facts = [
            f"The capital of {n} is {city[e['capital']]['name']}.",
            f"The official language of {n} is {e['language']}.",
            f"The currency of {n} is the {e['currency']}.",
            f"Cities of {n} include {', '.join(sorted(cities))}.",
        ]
    elif kind == "company":
        lead = f"{n} is {_a(e['industry'])} company."
        facts = [
            f"{n} was founded in {e['founded']} by {w['person'][e['founder']]['name']}.",
            f"The company has its headquarters in {city[e['headquarters']]['name']}.",
            f"{n} employs about {e['staff']:,} people.",
        ]
    elif kind == "university":
        lead = f"{n} is a public university with about {e['students']:,} students."
        facts = [
            f"{n} was established in {e['established']}.",
            f"The university is located in {city[e['campus']]['name']}.",
        ]
    else:
        creator = w["person"][e["creator"]]["name"]
        lead = f"{_mention(kind, e)} is {_a(e['kind'])}."
        facts = [
            f"It was {WORK_KINDS[e['kind']][1]} by {creator} and released in {e['year']}.",
            f"It was released by {w['company'][e['publisher']]['name']}.",
        ]
    rng.shuffle(facts)
    return " ".join([lead, *facts])


def _join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _event(i: int, w: dict[str, list[dict[str, Any]]], rng: random.Random) -> tuple[str, str]:
    """A distractor page: an event that mentions entities without stating any of their relations."""
    host = rng.choice(w["city"])
    year = rng.randint(1970, 2023)
    kind = rng.choice(EVENT_KINDS)
    title = f"{year} {host['name']} {kind}"
    people = [p["name"] for p in rng.sample(w["person"], rng.randint(3, 6))]
    orgs = [c["name"] for c in rng.sample(w["company"] + w["university"], rng.randint(2, 4))]
    works = [f'"{x["name"]}"' for x in rng.sample(w["work"], rng.randint(0, 2))]
    places = [c["name"] for c in rng.sample(w["city"], 2) if c is not host]
    text = (
        f"The {title} was held in {host['name']} in {year}. Participants included {_join(orgs)}. "
        f"Speakers were {_join(people)}. Visitors came from {_join(places)}."
    )
    if works:
        text += f" The programme featured {_join(works)}."
    return title, text


def build_corpus(w: dict[str, list[dict[str, Any]]], rng: random.Random) -> tuple[list[dict], dict]:
    """Documents (shuffled, ids ``d0001``...) and the doc id of every entity page by (kind, index)."""
    for kind in COUNTS:
        for i, e in enumerate(w[kind]):
            e["i"] = i
    pages: list[tuple[tuple[str, int] | None, str, str]] = [
        ((kind, i), e["name"], _page(kind, e, w, rng)) for kind in COUNTS for i, e in enumerate(w[kind])
    ]
    pages += [(None, *_event(i, w, rng)) for i in range(N_EVENTS)]
    rng.shuffle(pages)
    docs, doc_of = [], {}
    for j, (ref, title, text) in enumerate(pages):
        doc_id = f"d{j + 1:04d}"
        docs.append({"id": doc_id, "title": title, "text": text})
        if ref is not None:
            doc_of[ref] = doc_id
    return docs, doc_of


def sample_question(
    w: dict[str, list[dict[str, Any]]], hops: int, rng: random.Random
) -> tuple[list[tuple[str, int]], list[str], Any] | None:
    """A random chain of ``hops`` relations (the last may be an attribute); None when it revisits."""
    kind = rng.choice(sorted(COUNTS))
    path = [(kind, rng.randrange(len(w[kind])))]
    rels: list[str] = []
    for h in range(hops):
        kind, i = path[-1]
        options = [r for r, spec in RELATIONS.items() if spec[0] == kind]
        if h == hops - 1:
            options += [a for a, spec in ATTRIBUTES.items() if spec[0] == kind]
        rel = rng.choice(options)
        rels.append(rel)
        if rel in ATTRIBUTES:
            return path, rels, w[kind][i][rel]
        nxt = (RELATIONS[rel][1], w[kind][i][rel])
        if nxt in path:
            return None
        path.append(nxt)
    return path, rels, path[-1]


def build_questions(w: dict[str, list[dict[str, Any]]], doc_of: dict, rng: random.Random) -> list[dict]:
    """``QUESTIONS_PER_HOP`` distinct questions for every hop count, interleaved."""
    by_hops: dict[int, list[dict]] = {h: [] for h in range(1, MAX_HOPS + 1)}
    seen: set[str] = set()
    for hops in by_hops:
        while len(by_hops[hops]) < QUESTIONS_PER_HOP:
            sample = sample_question(w, hops, rng)
            if sample is None:
                continue
            path, rels, end = sample
            kind, i = path[0]
            desc = _mention(kind, w[kind][i])
            for rel in rels[:-1]:
                desc = RELATIONS[rel][2].format(desc)
            last = rels[-1]
            question = (ATTRIBUTES[last][1] if last in ATTRIBUTES else RELATIONS[last][3]).format(desc)
            if isinstance(end, tuple):
                answer, alias = w[end[0]][end[1]]["name"], aliases(end[0], w[end[0]][end[1]])
            else:
                answer, alias = str(end), []
            if question in seen:
                continue
            seen.add(question)
            gold = path[:hops]  # the entities whose pages state the relations followed
            by_hops[hops].append(
                {
                    "question": question,
                    "answer": answer,
                    "aliases": alias,
                    "hops": hops,
                    "gold_docs": [doc_of[ref] for ref in gold],
                    "queries": [w[k][j]["name"] for k, j in gold],
                    "relations": rels,
                }
            )
    out = [q for group in zip(*by_hops.values(), strict=True) for q in group]
    return [{"id": f"q{j + 1:04d}", **q} for j, q in enumerate(out)]


def generate(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """The corpus documents and the questions for ``seed``."""
    rng = random.Random(seed)
    world = build_world(rng)
    docs, doc_of = build_corpus(world, rng)
    return docs, build_questions(world, doc_of, rng)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--seed", type=int, default=SEED, help="world seed")
    args = parser.parse_args(argv)
    docs, questions = generate(args.seed)
    write_jsonl(args.out / "corpus.jsonl", docs)
    write_jsonl(args.out / "questions.jsonl", questions)
    print(f"wrote {len(docs)} documents and {len(questions)} questions to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

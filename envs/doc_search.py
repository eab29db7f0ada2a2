"""DocSearch: answer a question about a generated encyclopedia, found with a BM25 search tool.

* **Task** -- the env writes a small encyclopedia of invented towns, people and inventions
  (every fact drawn from the seed, so nothing can be known in advance) and asks a question
  about it: one fact (easy), or a chain of facts -- the town where a person grew up, the
  inventor of a device, then a fact about them (medium: 2 hops, hard: 3 hops).
* **Observation** -- one user message with the question (text only) and the tools
  `search(query, k)` (BM25 over the encyclopedia; returns JSON with each hit's id, title, score
  and text) and `submit_answer(answer)`.
* **Action** -- tool calls in the model's format (Qwen3/Hermes `<tool_call>` blocks by default;
  the env takes `parser="qwen3_coder"` or `"openai"` too), then the answer: `submit_answer` with
  the answer alone (a year, a number, a name or a word), or a reply ending in `\\boxed{...}`.
  Case, commas in numbers, "the" and a trailing "river" are ignored.
* **Reward** -- 1.0 for the right answer, 0.1 for a well-formed wrong one, else 0; `success`
  means the right answer.
* **Difficulty** -- `easy`: 5 towns, 6 people, 4 inventions; one-hop questions. `medium`: 10
  towns, 18 people, 10 inventions; two hops. `hard`: 16 towns, 36 people, 24 inventions,
  inventions that share a name word (the "Quillan lamp" and the "Quillan press"), three hops.
  Tool budget: 6 calls.

The oracle searches for each entity of the chain by name, picks the hit whose title is that
name, reads the next link out of the text and finally submits the fact it read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from relax_gym.tools import Document, Tool, search, submit_answer

from relax_gym.types import Action

from ._base import Task
from ._tool_task import OracleError, ToolTask, ToolTaskEnv, pick

SYLLABLES = (
    "bel", "cor", "dan", "fen", "gal", "hol", "ister", "jor", "kal", "lin", "mor", "nev", "ost", "pel", "quil",
    "ros", "sal", "tam", "ul", "var", "wen", "yar", "zel", "bra", "dru", "thal", "mira", "vos", "eld", "orn",
)
FIRST_NAMES = (
    "Ada", "Bruno", "Clara", "Dmitri", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lorenzo",
    "Maya", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tomas", "Una", "Viktor", "Wanda", "Yusuf", "Zora",
)
PROFESSIONS = (
    "clockmaker", "botanist", "engineer", "cartographer", "glassblower", "astronomer", "printer", "chemist",
    "shipwright", "weaver", "architect", "brewer", "luthier", "surveyor", "potter",
)
DEVICES = ("lamp", "press", "loom", "compass", "pump", "kiln", "telescope", "valve", "clock", "bellows")
REGIONS = ("northern", "southern", "eastern", "western", "central", "coastal", "highland")


@dataclass
class Town:
    name: str
    founded: int
    population: int
    river: str
    region: str


@dataclass
class Person:
    name: str
    born: int
    town: str
    profession: str


@dataclass
class Invention:
    name: str  # "Quillan lamp"
    inventor: str
    year: int


@dataclass(frozen=True)
class Level:
    towns: int
    people: int
    inventions: int
    hops: int
    shared_words: bool  # inventions share their invented word in pairs (harder to search)


LEVELS = {
    "easy": Level(5, 6, 4, 1, False),
    "medium": Level(10, 18, 10, 2, False),
    "hard": Level(16, 36, 24, 3, True),
}


class _Names:
    """Unique invented words from syllables."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int = 2) -> str:
        for _ in range(1000):
            w = "".join(str(pick(self.rng, SYLLABLES)) for _ in range(syllables)).capitalize()
            if w not in self.used and len(w) >= 5:
                self.used.add(w)
                return w
        raise RuntimeError("ran out of names")  # pragma: no cover - 900+ combinations per length


@dataclass
class World:
    towns: dict[str, Town]
    people: dict[str, Person]
    inventions: dict[str, Invention]

    def documents(self, rng: np.random.Generator) -> list[Document]:
        docs = [_town_doc(t, rng) for t in self.towns.values()]
        docs += [_person_doc(p, self.inventions, rng) for p in self.people.values()]
        docs += [_invention_doc(i, self.people[i.inventor], rng) for i in self.inventions.values()]
        order = rng.permutation(len(docs))
        return [Document(id=f"doc-{k + 1:03d}", title=docs[int(i)][0], text=docs[int(i)][1]) for k, i in enumerate(order)]


def make_world(rng: np.random.Generator, level: Level) -> World:
    names = _Names(rng)
    towns = {}
    for _ in range(level.towns):
        t = Town(names.word(), int(rng.integers(1150, 1900)), int(rng.integers(12, 4800)) * 100, names.word(), str(pick(rng, REGIONS)))
        towns[t.name] = t
    people = {}
    town_names = sorted(towns)
    for _ in range(level.people):
        p = Person(f"{pick(rng, FIRST_NAMES)} {names.word()}", int(rng.integers(1700, 1950)), str(pick(rng, town_names)), str(pick(rng, PROFESSIONS)))
        people[p.name] = p
    inventions = {}
    inventors = [str(x) for x in rng.choice(sorted(people), size=level.inventions, replace=False)]
    word = ""
    for k, who in enumerate(inventors):
        if not level.shared_words or k % 2 == 0:
            word = names.word()
            devices = [str(d) for d in rng.choice(DEVICES, size=2, replace=False)]
        inv = Invention(f"{word} {devices[k % 2] if level.shared_words else devices[0]}", who, people[who].born + int(rng.integers(20, 50)))
        inventions[inv.name] = inv
    return World(towns, people, inventions)


def _sentences(rng: np.random.Generator, first: str, rest: list[str]) -> str:
    """The first sentence, then the others in a random order (so positions carry no meaning)."""
    return " ".join([first] + [rest[int(i)] for i in rng.permutation(len(rest))])


def _town_doc(t: Town, rng: np.random.Generator) -> tuple[str, str]:
    text = _sentences(rng, f"{t.name} is a town in the {t.region} province.", [
        f"{t.name} was founded in {t.founded}.",
        f"The {t.river} river flows through {t.name}.",
        f"{t.name} has a population of {t.population:,}.",
        f"Its market square hosts a fair every {pick(rng, ('spring', 'summer', 'autumn', 'winter'))}.",
    ])
    return t.name, text


def _person_doc(p: Person, inventions: dict[str, Invention], rng: np.random.Generator) -> tuple[str, str]:
    rest = [f"{p.name.split()[0]} was born in {p.born}.", f"{p.name} grew up in {p.town}."]
    made = [i.name for i in inventions.values() if i.inventor == p.name]
    rest += [f"{p.name} invented the {m}." for m in made]
    rest.append(f"Colleagues remembered {p.name.split()[0]} as {pick(rng, ('patient', 'restless', 'meticulous', 'cheerful'))}.")
    article = "an" if p.profession[0] in "aeiou" else "a"
    return p.name, _sentences(rng, f"{p.name} was {article} {p.profession}.", rest)


def _invention_doc(i: Invention, inventor: Person, rng: np.random.Generator) -> tuple[str, str]:
    rest = [
        f"The {i.name} was invented by {i.inventor} in {i.year}.",
        f"Early models were built in {pick(rng, ('brass', 'oak', 'iron', 'copper'))}.",
    ]
    return i.name, _sentences(rng, f"The {i.name} is a {i.name.split()[-1]} of unusual design.", rest)


# -- questions: a chain of lookups ----------------------------------------------------------------
# Each link names the document to find and the pattern that reads the next value out of its text.
LINKS: dict[str, tuple[str, str]] = {
    "inventor": ("inventions", r"was invented by ([A-Z][a-z]+ [A-Z][a-z]+) in"),
    "hometown": ("people", r"grew up in ([A-Z][a-z]+)\."),
    "profession": ("people", r"was an? ([a-z]+)\."),
    "born": ("people", r"was born in (\d{4})\."),
    "founded": ("towns", r"was founded in (\d{4})\."),
    "population": ("towns", r"has a population of ([\d,]+)\."),
    "river": ("towns", r"The ([A-Z][a-z]+) river flows"),
}
FACTS = {"people": ("profession", "born"), "towns": ("founded", "population", "river")}
PHRASES = {
    "profession": "What was the profession of {}?",
    "born": "In what year was {} born?",
    "founded": "In what year was {} founded?",
    "population": "What is the population of {}?",
    "river": "Which river flows through {}?",
}
SUBJECTS = {"hometown": "the town where {} grew up", "inventor": "the inventor of the {}"}


def make_question(rng: np.random.Generator, world: World, hops: int) -> tuple[str, str, list[str]]:
    """(question, the entity to start from, the chain of links) with ``hops`` lookups."""
    if hops == 3:
        start, chain = str(pick(rng, sorted(world.inventions))), ["inventor", "hometown"]
    elif hops == 2:
        if rng.random() < 0.5:
            start, chain = str(pick(rng, sorted(world.people))), ["hometown"]
        else:
            start, chain = str(pick(rng, sorted(world.inventions))), ["inventor"]
    else:
        kind = "towns" if rng.random() < 0.5 else "people"
        start, chain = str(pick(rng, sorted(getattr(world, kind)))), []
    final_kind = {"inventor": "people", "hometown": "towns"}[chain[-1]] if chain else ("towns" if start in world.towns else "people")
    fact = str(pick(rng, FACTS[final_kind]))
    subject = start
    for link in chain:
        subject = SUBJECTS[link].format(subject)
    return PHRASES[fact].format(subject), start, chain + [fact]


def follow(world: World, start: str, chain: list[str]) -> str:
    """The answer, by walking the chain on the world's records."""
    entity = start
    for link in chain:
        if link == "inventor":
            entity = world.inventions[entity].inventor
        elif link == "hometown":
            entity = world.people[entity].town
        elif link in ("profession", "born"):
            return str(getattr(world.people[entity], link))
        elif link in ("founded", "population", "river"):
            return str(getattr(world.towns[entity], link))
    raise ValueError(f"the chain {chain} ends without a fact")


def normalize(answer: str) -> str | None:
    """Case, punctuation, commas in numbers, a leading "the" and a trailing "river" do not matter."""
    text = answer.lower().replace(",", "").strip().rstrip(".")
    text = re.sub(r"^the\s+", "", text)
    if text.endswith("river") and text[:-5].rstrip() != text[:-5]:  # no regex: "\s+river$" is quadratic
        text = text[:-5]
    text = " ".join(text.split())
    return text if text and len(text) <= 40 and re.fullmatch(r"[a-z0-9 '\-]+", text) else None


class DocSearchTask(ToolTask[Level]):
    """The encyclopedia of one episode (``documents``, read by the search tool) and a question."""

    levels = LEVELS
    modalities = ("text",)

    def __init__(self, difficulty: str = "easy") -> None:
        super().__init__(difficulty)
        self.documents: list[Document] = []
        self.start = ""
        self.chain: list[str] = []

    def make_task(self, level: Level) -> Task:
        world = make_world(self.np_random, level)
        self.documents = world.documents(self.np_random)
        question, self.start, self.chain = make_question(self.np_random, world, level.hops)
        answer = follow(world, self.start, self.chain)
        prompt = (
            f"{question}\n\nThe answer is in a private encyclopedia of {len(self.documents)} articles that only the search "
            "tool can read (you will not know these names). When you have found it, call submit_answer with the answer "
            "alone -- a year, a number, a name or one word (or reply with \\boxed{answer})."
        )
        return Task(prompt, normalize(answer), answer, (), {"hops": level.hops, "chain": list(self.chain)})

    def parse_answer(self, raw: str) -> str | None:
        return normalize(raw)

    def random_answer(self, rng: np.random.Generator) -> str:
        kind = str(pick(rng, ("year", "number", "word", "profession")))
        if kind == "year":
            return str(int(rng.integers(1150, 1950)))
        if kind == "number":
            return f"{int(rng.integers(12, 4800)) * 100:,}"
        if kind == "profession":
            return str(pick(rng, PROFESSIONS))
        return _Names(rng).word()


class DocSearchEnv(ToolTaskEnv[DocSearchTask]):
    """Question answering over a generated document collection with a BM25 search tool."""

    task_cls = DocSearchTask
    tool_budget = 6
    modalities = ("text",)
    tags = ("tools", "multi-turn", "retrieval", "multi-hop")

    @classmethod
    def shared_tools(cls) -> list[Tool]:
        return [search, submit_answer]

    def random_tool_call(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        words = [_Names(rng).word(), str(pick(rng, ("founded", "river", "population", "invented", "born")))]
        return "search", {"query": " ".join(words), "k": int(rng.integers(1, 6))}

    def oracle(self) -> Iterator[Action | str]:
        task = self.task_env
        task.require_task()
        entity = task.start
        for link in task.chain:
            yield self.call("search", query=entity, k=5)
            hits = self.tool_json("search")
            doc = next((h for h in hits if h["title"] == entity), None)
            if doc is None:
                raise OracleError(f"search for {entity!r} did not return its article: {[h['title'] for h in hits]}")
            match = re.search(LINKS[link][1], doc["text"])
            if match is None:
                raise OracleError(f"article {entity!r} does not say {link}: {doc['text']!r}")
            entity = match.group(1)
        yield self.submit(entity)

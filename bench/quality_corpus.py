"""A labelled conversational-memory corpus, generated from a seed: what the quality gate
measures evidence recall on (``bench/test_bench_quality.py``).

Each conversation is one scope: two speakers over dated sessions of chit-chat turns, with
facts about each speaker's life stated once in passing, among distractors (the same kind
of fact about other people, earlier values of a fact that changed later). Questions are
asked the way a user asks them, not in the fact's words:

- paraphrase: "What kind of pet does Maya have?" for "we finally brought home a beagle";
- dates: "When did Maya start the pottery class?" for a fact stated in a dated session;
- multi-hop: "What does Maya's brother do for a living?" needs "my brother Tom" and
  "Tom just got his pilot licence" (two evidence turns);
- updates: "Where does Maya live now?" needs the latest move, with the earlier one a
  distractor.

The generator uses only `random.Random(seed)`: the same seed gives the same corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Corpus", "generate"]

NAMES = [
    "Maya",
    "Omar",
    "Lena",
    "Tariq",
    "Ines",
    "Jonas",
    "Priya",
    "Kofi",
    "Sofia",
    "Mateo",
    "Aiko",
    "Ravi",
    "Elena",
    "Dmitri",
    "Chloe",
    "Kwame",
    "Hana",
    "Lucas",
    "Nadia",
    "Felix",
]
RELATIVES = ["brother", "sister", "cousin", "aunt", "uncle", "best friend", "neighbor", "roommate"]
REL_NAMES = ["Tom", "Ana", "Yusuf", "Greta", "Bilal", "Marta", "Kenji", "Zoe", "Arjun", "Lina", "Pavel", "Iris"]
JOBS = [
    ("pilot", "got his pilot licence and flies cargo planes now", "What does {who}'s {rel} do for a living?"),
    ("nurse", "started night shifts at the children's hospital", "What does {who}'s {rel} do for a living?"),
    ("chef", "opened a tiny ramen counter downtown", "What does {who}'s {rel} do for a living?"),
    ("teacher", "teaches chemistry to high schoolers", "What does {who}'s {rel} do for a living?"),
    ("architect", "designs libraries and train stations", "What does {who}'s {rel} do for a living?"),
]
PETS = [
    ("beagle", "we finally brought home a beagle puppy, he chews everything"),
    ("parrot", "our new parrot already says good morning at six"),
    ("tortoise", "I adopted an old tortoise from the shelter, she is very slow and very wise"),
    ("rabbit", "the rabbit we got keeps escaping under the fence"),
    ("cat", "a stray kitten moved in with us and never left"),
]
HOBBIES = [
    ("pottery", "I signed up for a pottery class on Thursday evenings"),
    ("climbing", "I started bouldering at the gym near the station"),
    ("violin", "I picked up the violin again after ten years"),
    ("chess", "I joined a chess club that meets in the library"),
    ("sailing", "I took a sailing course on the lake"),
    ("painting", "I have been painting watercolors every weekend"),
]
CITIES = ["Lisbon", "Montreal", "Osaka", "Nairobi", "Valencia", "Krakow", "Melbourne", "Denver", "Tallinn", "Quito"]
FILLER = [
    "haha yes, that sounds exactly like you",
    "how has your week been going?",
    "honestly I just need a long nap",
    "we should grab coffee sometime soon",
    "the weather has been so strange lately",
    "I watched a documentary about octopuses yesterday",
    "work has been hectic but fine",
    "did you see the game last night?",
    "I keep forgetting to water my plants",
    "that reminds me, I still owe you lunch",
    "traffic this morning was unbelievable",
    "I tried a new recipe and it was a disaster",
    "my phone screen cracked again",
    "I am thinking about taking a day off",
    "sorry for the late reply, it was a busy day",
    "thanks for listening, it helps a lot",
    "I finally finished that book you recommended",
    "what are your plans for the weekend?",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
DAY = 86400.0


@dataclass(frozen=True)
class Corpus:
    """Memories (dicts for ``NewMemory``) and labels (``ctxcore.evaluation.Label`` lines)."""

    memories: list[dict[str, object]]
    labels: list[dict[str, object]]


def generate(seed: int, conversations: int = 6, sessions: int = 12, turns: int = 24) -> Corpus:
    """The corpus for `seed`: `conversations` scopes of `sessions` dated sessions of about
    `turns` turns each, and their labelled questions."""
    rng = random.Random(seed)
    memories: list[dict[str, object]] = []
    labels: list[dict[str, object]] = []
    t0 = 1_672_531_200.0 + rng.randrange(0, 365) * DAY  # some day of 2023
    for c in range(conversations):
        agent = f"conv{c}"
        a, b = rng.sample(NAMES, 2)
        session_days = sorted(rng.sample(range(0, 400), sessions))
        # What each speaker's facts are, decided up front; each is stated in some session.
        facts: list[tuple[str, str, str, str]] = []  # (speaker, fact text, question, kind)
        hops: list[tuple[str, str, str, str]] = []  # (speaker, first text, second text, question)
        for who in (a, b):
            pet, pet_text = rng.choice(PETS)
            facts.append((who, pet_text, f"What kind of pet does {who} have?", "paraphrase"))
            hobby, hobby_text = rng.choice(HOBBIES)
            facts.append((who, hobby_text, f"When did {who} start {hobby}?", "date"))
            rel = rng.choice(RELATIVES)
            rel_name = rng.choice(REL_NAMES)
            _, job_text, job_q = rng.choice(JOBS)
            hops.append(
                (
                    who,
                    f"my {rel} {rel_name} is visiting next month",
                    f"{rel_name} {job_text}",
                    job_q.format(who=who, rel=rel),
                )
            )
            first, latest = rng.sample(CITIES, 2)
            facts.append((who, f"we are moving to {first} for a while", "", "old-city"))
            facts.append(
                (
                    who,
                    f"big news: we left {first} and settled in {latest} for good",
                    f"Where does {who} live now?",
                    "update",
                )
            )
        order = list(range(sessions))
        events: list[tuple[int, str, str, str, str]] = []  # (session, speaker, text, label key, kind)
        for who, text, q, kind in facts:
            s = rng.choice(order[1:-1])
            if kind == "update":
                s = sessions - 1 - rng.randrange(0, 3)
            if kind == "old-city":
                s = rng.randrange(0, sessions // 2)
            events.append((s, who, text, q, kind))
        for who, one, two, q in hops:
            s1 = rng.randrange(0, sessions // 2)
            s2 = rng.randrange(sessions // 2, sessions)
            events.append((s1, who, one, q, "hop"))
            events.append((s2, who, two, q, "hop"))
        evidence: dict[str, list[str]] = {}
        for s, day in enumerate(session_days):
            when = t0 + day * DAY
            stated = [e for e in events if e[0] == s]
            n = turns + rng.randrange(-4, 5)
            slots = sorted(rng.sample(range(1, n), min(len(stated), n - 1)))
            k_event = 0
            for k in range(n):
                speaker = a if k % 2 == 0 else b
                mid = f"{agent}:s{s}:t{k}"
                if k_event < len(stated) and k == slots[k_event]:
                    _, who, text, q, kind = stated[k_event]
                    k_event += 1
                    body = f"{who}: {text}"
                    if q:
                        evidence.setdefault(q, []).append(mid)
                else:
                    other = rng.choice([x for x in NAMES if x not in (a, b)])
                    if rng.random() < 0.12:
                        # A distractor: the same kind of fact about someone else.
                        body = f"{speaker}: " + rng.choice(
                            [
                                f"{other} told me {rng.choice(PETS)[1]}",
                                f"{other} said {rng.choice(HOBBIES)[1]}",
                                f"{other} is moving to {rng.choice(CITIES)} soon",
                                f"{other}'s {rng.choice(RELATIVES)} {rng.choice(JOBS)[1]}",
                            ]
                        )
                    else:
                        body = f"{speaker}: {rng.choice(FILLER)}"
                memories.append(
                    {
                        "id": mid,
                        "organization_id": "bench",
                        "agent_id": agent,
                        "text": body,
                        "created_at": when + 60.0 * k,
                    }
                )
            if s == 0 or rng.random() < 0.3:
                memories.append(
                    {
                        "id": f"{agent}:s{s}:date",
                        "organization_id": "bench",
                        "agent_id": agent,
                        "text": f"{a}: (session on {MONTHS[int((day // 30) % 12)]} {1 + int(day % 28)})",
                        "created_at": when,
                    }
                )
        for q, ids in evidence.items():
            labels.append({"query": q, "evidence": ids, "organization_id": "bench", "agent_id": agent})
    return Corpus(memories, labels)

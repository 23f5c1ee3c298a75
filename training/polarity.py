"""Polarity pairs: a generated training task of ``train-links --mixture polarity=W`` (issue 28).

Reuse answered "What does the warranty cover?" with the exclusions of an FAQ (issue 17's newcomer case), and the
hand-written contrast check (:mod:`evaluation.contrast`) shows the kind: when two documents on one subject say
opposite things (covers / does not cover, open / closed, allowed / forbidden), the adapted model answers from
either. NQ's distractors are other questions' passages and never teach this. Each example here is a subject
with two documents of opposite polarity, each listing three items, plus other subjects' documents; the
question asks for the positive list or (half of the time) the negative one, so reading the polarity is the only
way to the answer (a model that avoided the negated document would fail the negative questions).

Generated, never downloaded: frames, subjects and items are drawn from ``random.Random(seed * 1_000_003 +
index)``. None of the contrast check's subjects or phrases occurs here (its items, not even its words, are
excluded from the vocabulary, tested), so that check stays held out.

No torch here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvlink_rag.types import Document

# (positive statement, negative statement, positive question, negative question); {s}: subject, {x}: items
FRAMES = (
    ("The {s} covers {x}.", "The {s} does not cover {x}.", "What does the {s} cover?",
     "What does the {s} not cover?"),
    ("The {s} includes {x}.", "The {s} does not include {x}; they cost extra.", "What does the {s} include?",
     "What is not included in the {s}?"),
    ("{X} are allowed at the {s}.", "{X} are forbidden at the {s}.", "What is allowed at the {s}?",
     "What is forbidden at the {s}?"),
    ("The {s} accepts {x}.", "The {s} does not accept {x}.", "What does the {s} accept?",
     "What does the {s} refuse?"),
    ("We recommend {x} for the {s}.", "We advise against {x} for the {s}.", "What is recommended for the {s}?",
     "What is advised against for the {s}?"),
    ("{X} are safe to use with the {s}.", "{X} are not safe to use with the {s}.",
     "What is safe to use with the {s}?", "What is not safe to use with the {s}?"),
    ("The {s} offers {x}.", "The {s} no longer offers {x}.", "What does the {s} offer?",
     "What does the {s} no longer offer?"),
)
SUBJECTS = ("basic plan", "premium plan", "harbour tour", "ski pass", "rail card", "hostel", "campsite",
            "conference centre", "science lab", "art studio", "student card", "cinema club", "night bus",
            "ferry ticket", "cooking course", "language school", "bike rental", "car hire", "dental plan",
            "home policy", "roof garden", "workshop", "youth club", "tennis club", "sailing school",
            "summer camp", "print shop", "music room", "photo booth", "market hall")
ITEMS = ("guided walks", "lockers", "wifi", "breakfast", "helmets", "sheets", "laundry",
         "charging cables", "paint", "glue", "scissors", "skis", "boots",
         "gloves", "life jackets", "paddles", "tents", "stoves", "lanterns", "ropes", "cameras", "tripods",
         "speakers", "microphones", "pianos", "drums", "violins", "bicycles", "scooters", "trolleys",
         "wheelchairs", "prams", "blankets", "pillows", "printers", "staplers", "envelopes", "stamps", "coffee",
         "green tea", "juice", "sandwiches", "pastries", "fruit", "candles", "matches", "lighters", "balloons",
         "kites", "frisbees", "footballs", "rackets", "nets", "goggles", "sun cream",
         "insect spray", "fishing rods", "ladders", "hammers", "drills", "saws", "paint rollers", "keys",
         "badges", "wristbands", "tokens", "coupons", "vouchers", "souvenirs", "postcards", "posters",
         "stickers", "magnets", "mugs", "hats", "scarves", "deck chairs", "hammocks",
         "barbecues", "heaters", "fans", "lamps", "mirrors", "clocks", "radios", "televisions", "tablets",
         "headphones", "pencils", "crayons", "rulers", "calculators")
TITLES = ("Details.", "Notice.", "Information.", "Please note.", "Guest guide.", "Frequently asked questions.",
          "Terms.", "Update.")
FILLERS = ("Ask at the front desk for details.", "This applies from the first of the month.",
           "Prices are shown on the website.", "Staff can answer further questions.",
           "See the full terms online.", "The rules were last updated this year.")
POLARITY_TRAIN_SEED = 5001
POLARITY_VAL_SEED = 8001


@dataclass(frozen=True)
class PolarityExample:
    """One question: ``answers[0]`` the asked list as written ("a, b and c"), then each item; ``docs`` the
    documents in slot order, ``gold`` the slot of the answering one, ``negative`` whether the negated list
    is asked."""

    question: str
    answers: tuple[str, ...]
    docs: tuple[Document, ...]
    gold: int
    negative: bool


def _listing(items: list[str]) -> str:
    return f"{items[0]}, {items[1]} and {items[2]}"


def _document(rng: random.Random, statement: str) -> Document:
    return Document(f"{rng.choice(TITLES)} {statement} {rng.choice(FILLERS)}")


def _statement(template: str, subject: str, items: list[str]) -> str:
    listing = _listing(items)
    return template.format(s=subject, x=listing, X=listing[0].upper() + listing[1:])


def make_example(index: int, n_docs: int = 4, seed: int = POLARITY_TRAIN_SEED) -> PolarityExample:
    """Question ``index``: a subject's positive and negative documents (three distinct items each) and
    ``n_docs - 2`` documents of other subjects, in a random order.

    Raises:
        ValueError: ``n_docs`` below 2 or above the number of subjects + 1, or ``index`` negative.
    """
    if not 2 <= n_docs <= len(SUBJECTS) + 1:
        raise ValueError(f"polarity examples take 2..{len(SUBJECTS) + 1} documents, not {n_docs}")
    if index < 0:
        raise ValueError(f"question index {index} must be >= 0")
    rng = random.Random(seed * 1_000_003 + index)
    subjects = rng.sample(SUBJECTS, n_docs - 1)
    frame = rng.choice(FRAMES)
    items = rng.sample(ITEMS, 6)
    pos = _document(rng, _statement(frame[0], subjects[0], items[:3]))
    neg = _document(rng, _statement(frame[1], subjects[0], items[3:]))
    others = [_document(rng, _statement(rng.choice(FRAMES)[rng.randrange(2)], s, rng.sample(ITEMS, 3)))
              for s in subjects[1:]]
    negative = rng.random() < 0.5
    asked = items[3:] if negative else items[:3]
    docs = [pos, neg, *others]
    rng.shuffle(docs)
    gold = docs.index(neg if negative else pos)
    question = frame[3 if negative else 2].format(s=subjects[0])
    return PolarityExample(question, (_listing(asked), *asked), tuple(docs), gold, negative)
